"""Decode steps in one compiled call (models/fast_decode.py) against the layer-by-layer forward."""

import pytest
import torch

from fusionrag_llm.kernels import cpu_quant
from fusionrag_llm.models.config import config_from_hf
from fusionrag_llm.models.fast_decode import DecodeProgram
from fusionrag_llm.models.forward import ForwardPass, LayerHook
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.models.tiny import tiny_hf_config, tiny_state_dict

try:
    cpu_quant.load_library()
except RuntimeError as exc:
    pytest.skip(f"no CPU kernel here: {exc}", allow_module_level=True)

# (family, overrides): the built-in tiny shape (head_dim 16, 2 query heads per kv head), SmolLM2's head
# shape (64, 3 per kv head: the AVX-512 path where the CPU has it), a 128-dim one with 4 per kv head,
# Qwen2's q/k/v biases, plain multi-head attention, and Qwen3's per-head q/k norms
SHAPES = {
    "tiny": ("llama", {}),
    "d64-g3": ("llama", {"hidden_size": 192, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64}),
    "d128-g4": ("llama", {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128}),
    "d128-g2": ("llama", {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128}),
    "d64-g1": ("llama", {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64}),
    "qwen2-bias": ("qwen2", {"head_dim": 64, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1}),
    "mha": ("mistral", {"num_key_value_heads": 4}),
    "qwen3-qk-norm": ("qwen3", {"head_dim": 64, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}),
}


def _model(shape: str = "tiny", weights: str = "q4", seed: int = 0) -> DecoderLM:
    family, overrides = SHAPES[shape]
    model = DecoderLM(config_from_hf(tiny_hf_config(family, **overrides), f"tiny-{shape}"))
    model.load_state_dict(tiny_state_dict(model, seed))
    model.eval()
    model.quantize_linears(weights)
    return model


def _prefill(model: DecoderLM, length: int, capacity: int, seed: int = 1):
    ids = torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(seed))
    cache = model.new_cache(capacity)
    slots = cache.reserve(length)
    out = model.forward(ForwardPass(ids, torch.arange(length), slots, logit_rows=torch.tensor([length - 1])), cache)
    return cache, int(out.logits[0].argmax())


def _decode_step(cache, token: int) -> ForwardPass:
    slot = cache.reserve(1)
    position = int(cache.positions[: cache.length - 1].max()) + 1
    return ForwardPass(torch.tensor([token]), torch.tensor([position]), slot, decode=True)


def _spy(monkeypatch) -> list[int]:
    runs = []
    run = DecodeProgram.run
    monkeypatch.setattr(DecodeProgram, "run", lambda self, x, batch: runs.append(len(batch.steps)) or run(self, x, batch))
    return runs


def _decode(model: DecoderLM, caches, tokens, compiled: bool, steps: int):
    """Greedy decode steps of every cache at once; the logits of each step."""
    model.compiled_decode = compiled
    history = []
    for _ in range(steps):
        passes = [_decode_step(cache, token) for cache, token in zip(caches, tokens)]
        outs = model.forward_batch(passes, caches)
        logits = torch.cat([out.logits for out in outs])
        history.append(logits)
        tokens = logits.argmax(-1).tolist()
    return history


def _assert_compiled_like_layers(model: DecoderLM, lengths, steps: int) -> None:
    """From each prompt length, ``steps`` greedy decode steps compiled and layer by layer give the same
    logits and write the same K/V."""
    for length in lengths:
        cache, token = _prefill(model, length, length + steps + 4)
        twin = cache.fork()
        want = _decode(model, [twin], [token], compiled=False, steps=steps)
        got = _decode(model, [cache], [token], compiled=True, steps=steps)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))
        n = cache.length
        assert n == twin.length == length + steps
        torch.testing.assert_close(cache.keys[:, :, :n], twin.keys[:, :, :n], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(cache.values[:, :, :n], twin.values[:, :, :n], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("weights", ["q4", "q8", "float"])
def test_compiled_steps_compute_the_layer_by_layer_forward(shape, weights, monkeypatch):
    """Over prompts of a few tokens and of more than one attention task (512 keys) per kv head."""
    model = _model(shape, weights)
    assert model.decode_program is not None
    runs = _spy(monkeypatch)
    _assert_compiled_like_layers(model, (5, 700), steps=4)
    assert runs == [1] * 8  # the compiled steps only


def test_several_sequences_of_different_lengths_in_one_call(monkeypatch):
    model = _model("d64-g3")
    prompts = [_prefill(model, length, length + 6, seed=length) for length in (3, 257, 600)]
    caches, tokens = [p[0] for p in prompts], [p[1] for p in prompts]
    twins = [cache.fork() for cache in caches]
    runs = _spy(monkeypatch)
    got = _decode(model, caches, tokens, compiled=True, steps=3)
    assert runs == [3] * 3
    want = _decode(model, twins, tokens, compiled=False, steps=3)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))


class _Seen(LayerHook):
    def __init__(self, seen):
        self.seen = seen

    def after_write(self, layer, queries, cache, step):
        self.seen.append(layer)


def test_models_and_steps_it_does_not_take_run_layer_by_layer(monkeypatch):
    half = _model("tiny", weights="float").to(torch.bfloat16)
    half.quantize_linears("float")
    assert half.decode_program is None  # the compiled layers compute in float32 only

    model = _model("d64-g3")
    runs = _spy(monkeypatch)
    cache, token = _prefill(model, 20, 40)
    seen = []
    step = _decode_step(cache, token)
    step.hooks = (_Seen(seen),)  # a layer hook sees every layer
    model.forward(step, cache)
    assert runs == [] and seen == [0, 1, 2]
    two = _decode_step(cache, token)  # two tokens in one step are no decode step of one token
    two = ForwardPass(torch.tensor([token, token]), torch.cat([two.positions, two.positions + 1]),
                      torch.cat([two.slots, cache.reserve(1)]), decode=True)  # fmt: skip
    model.forward(two, cache)
    assert runs == []
    _decode(model, [cache], [token], compiled=True, steps=1)
    assert runs == [1]


def test_a_weight_changed_after_quantizing_is_read_as_the_python_forward_reads_it(monkeypatch):
    """An in-place change makes the quantized copies stale: the step runs layer by layer on the float
    weight, as it would without the compiled call."""
    model = _model("d64-g3")
    runs = _spy(monkeypatch)
    cache, token = _prefill(model, 10, 20)
    twin = cache.fork()
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(0.5)
    assert not model.decode_program.current()
    got = _decode(model, [cache], [token], compiled=True, steps=2)
    want = _decode(model, [twin], [token], compiled=False, steps=2)
    assert runs == []
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_the_engine_decodes_the_same_tokens_either_way(monkeypatch):
    from fusionrag_llm import FusionRAG, RAGRequest

    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False, "decode_weights": "q4"})
    requests = [RAGRequest(chunks=["Ada Lovelace wrote the first program.", "She was born in London."],
                           question="Where was the first programmer born?"),
                RAGRequest(chunks=["Grace Hopper wrote the first compiler."], question="Who wrote it?")]  # fmt: skip
    model = rag.engine.model
    runs = _spy(monkeypatch)
    results = {}
    for compiled in (False, True):
        model.compiled_decode = compiled
        one = rag.generate(requests[0], method="fusionrag", max_new_tokens=12, sampling={"ignore_eos": True})
        many = rag.generate_many(requests, method="full_reuse", max_new_tokens=12, sampling={"ignore_eos": True})
        streamed = [event for event in rag.stream(requests[1], method="full_attention", max_new_tokens=12)]
        results[compiled] = (one.token_ids, [g.token_ids for g in many], len(streamed))
        assert bool(runs) == compiled
    assert results[True] == results[False]


def test_the_environment_turns_it_off_and_refuses_other_values(monkeypatch):
    from fusionrag_llm import FusionRAG, FusionRAGError

    monkeypatch.setenv("FUSIONRAG_COMPILED_DECODE", "0")
    assert not FusionRAG.from_pretrained("tiny", store=":memory:", options={"decode_weights": "q4"}).engine.model.compiled_decode
    monkeypatch.setenv("FUSIONRAG_COMPILED_DECODE", "yes")
    with pytest.raises(FusionRAGError, match="FUSIONRAG_COMPILED_DECODE must be 0 or 1"):
        FusionRAG.from_pretrained("tiny", store=":memory:")
    monkeypatch.delenv("FUSIONRAG_COMPILED_DECODE")
    assert FusionRAG.from_pretrained("tiny", store=":memory:", options={"decode_weights": "q4"}).engine.model.compiled_decode


def test_projections_in_different_formats_and_float_weights_in_one_model(monkeypatch):
    """q/k/v in two formats (three products instead of one), biases kept apart, and a float weight
    among quantized ones: each projection is read as the layer-by-layer forward reads it."""
    model = _model("qwen2-bias", "q4")
    for index, block in enumerate(model.model.layers):
        block.self_attn.k_proj.quantize("q8")
        assert not block.self_attn.qkv.fuse()
        if index == 1:
            block.mlp.up_proj.quantize(None)
            assert not block.mlp.gate_up.fuse()
    model.decode_program = DecodeProgram.build(model)
    assert model.decode_program is not None
    runs = _spy(monkeypatch)
    _assert_compiled_like_layers(model, (7, 280), steps=3)
    assert runs == [1] * 6


@pytest.mark.parametrize("weights", ["q4", "float"])
def test_a_decode_token_beside_a_prefill_gets_the_logits_it_gets_without_one(weights, monkeypatch):
    """A step that also prefills (a request arriving while others decode) runs its decode tokens through
    the compiled call on their own: a sequence's numbers do not depend on who else is in its step."""
    model = _model("d64-g3", weights)
    cache, token = _prefill(model, 30, 40)
    twin = cache.fork()
    runs = _spy(monkeypatch)
    alone = model.forward_batch([_decode_step(cache, token)], [cache])[0].logits
    prompt = torch.arange(12) + 5
    single, other = model.new_cache(20), model.new_cache(20)
    want = model.forward(ForwardPass(prompt, torch.arange(12), single.reserve(12)), single).logits  # the prefill alone
    prefill = ForwardPass(prompt, torch.arange(12), other.reserve(12))
    outs = model.forward_batch([prefill, _decode_step(twin, token)], [other, twin])
    assert runs == [1, 1]  # the decode token, in both steps, through the compiled call
    assert torch.equal(outs[1].logits, alone)
    torch.testing.assert_close(outs[0].logits, want, rtol=0, atol=0)
    n = cache.length
    assert torch.equal(twin.keys[:, :, :n], cache.keys[:, :, :n]) and torch.equal(twin.values[:, :, :n], cache.values[:, :, :n])
