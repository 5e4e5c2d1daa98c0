"""Position-free keys, subset recompute against supplied KV, token-by-token decode."""

import torch
from fusionrag_llm.kernels.rotary import rotate

from fusionrag_llm.models.llama import ForwardPass
from fusionrag_llm.models.loader import load_model


def run(model, ids, positions, cache, slots=None, **kw):
    slots = cache.reserve(len(ids)) if slots is None else slots
    return model(ForwardPass(token_ids=ids, positions=positions, slots=slots, **kw), cache)


def test_rotary_of_stored_key_equals_key_computed_at_position():
    model = load_model("tiny-qwen3").model  # q/k norms precede rotary: the stored key is post-norm
    ids = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(500, 530)  # far from zero: the rotation is not the identity
    cache = model.new_cache(30)
    out = run(model, ids, positions, cache, capture_raw_kv=True)
    cos, sin = model.rotary_cos_sin(positions)
    placed = rotate(out.raw_keys, cos, sin)  # [layers, kv_heads, n, d]
    assert torch.allclose(placed, cache.keys, atol=1e-6, rtol=0)
    assert not torch.allclose(out.raw_keys, cache.keys, atol=1e-3)


def test_layer0_raw_keys_do_not_depend_on_position():
    model = load_model("tiny").model
    ids = torch.arange(40, 60)
    first = run(model, ids, torch.arange(20), model.new_cache(20), capture_raw_kv=True)
    moved = run(model, ids, torch.arange(1000, 1020), model.new_cache(20), capture_raw_kv=True)
    assert torch.equal(first.raw_keys[0], moved.raw_keys[0])


def test_subset_against_kv_of_the_rest_reproduces_full_pass():
    model = load_model("tiny-llama").model
    n = 64
    ids = torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(3))
    full_cache = model.new_cache(n)
    full = run(model, ids, torch.arange(n), full_cache).logits

    subset = torch.tensor([63, 5, 40, 17, 41, 0, 30])  # out of order, includes the first and last
    rest = torch.tensor([p for p in range(n) if p not in set(subset.tolist())])
    cache = model.new_cache(n)
    # The rest's exact KV sits in the first slots; the subset gets the remaining slots, shuffled.
    cache.reserve(len(rest))
    cache.keys[:, :, : len(rest)] = full_cache.keys[:, :, rest]
    cache.values[:, :, : len(rest)] = full_cache.values[:, :, rest]
    cache.positions[: len(rest)] = rest
    cache.valid[: len(rest)] = True
    partial = run(model, ids[subset], subset, cache).logits
    assert (partial - full[subset]).abs().max().item() <= 1e-5


def test_prefix_then_suffix_equals_one_pass_and_decode_extends_it():
    model = load_model("tiny-mistral").model
    ids = torch.randint(0, 256, (50,), generator=torch.Generator().manual_seed(4))
    whole = run(model, ids, torch.arange(50), model.new_cache(50)).logits
    cache = model.new_cache(50)
    run(model, ids[:20], torch.arange(20), cache)
    tail = run(model, ids[20:], torch.arange(20, 50), cache).logits
    assert (tail - whole[20:]).abs().max().item() <= 1e-5
    for p in range(45, 50):  # decode one token at a time over the prefix's KV
        cache2 = model.new_cache(50)
        run(model, ids[:p], torch.arange(p), cache2)
        step = run(model, ids[p : p + 1], torch.tensor([p]), cache2).logits
        assert (step[0] - whole[p]).abs().max().item() <= 1e-5


def test_invalid_slots_are_not_attended():
    model = load_model("tiny").model
    ids = torch.arange(60, 90)
    reference = run(model, ids, torch.arange(30), model.new_cache(30)).logits
    cache = model.new_cache(40)
    junk = cache.reserve(10)  # garbage KV in slots that are never marked valid
    cache.keys[:, :, junk] = 100.0
    cache.values[:, :, junk] = -100.0
    out = run(model, ids, torch.arange(30), cache).logits
    assert (out - reference).abs().max().item() <= 1e-5
