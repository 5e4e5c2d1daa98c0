"""variant_policy: which of a chunk's stored variants serves a request. "overlap": the fused entry only
when its fusion neighbours are there; "check": the variant whose KV at layer VARIANT_CHECK_LAYER is
closer to the prompt's exact KV there."""

import pytest
import torch

from fusionrag_llm import FusionRAG, FusionRAGError, RAGRequest
from fusionrag_llm.engine.methods import VARIANT_BLEND, VARIANT_CHECK_LAYER, check_run_options
from fusionrag_llm.storage import KVEntry

TEXTS = ["Anna keeps the lighthouse on Skerry.", "Anna's lighthouse was built in 1890.",
         "Carl runs the ferry to Holm.", "Carl's ferry leaves at nine."]  # fmt: skip


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    # neighbours: 0 <-> 1 and 2 <-> 3
    rag.add_chunks(TEXTS, embeddings=[[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], neighbors=1)
    return rag


def test_overlap_keeps_fused_entries_whose_neighbours_are_present_and_declines_the_rest(rag):
    # chunk 0 follows S0 (its plain entry is exact); chunk 1 was fused after chunk 0 (present);
    # chunk 2 was fused after chunk 3 (absent)
    request = RAGRequest(chunks=TEXTS[:3], question="Who keeps the lighthouse?")
    paper = rag.generate(request, method="fusionrag_paper", recompute_ratio=0.0, max_new_tokens=2)
    chosen = rag.generate(request, method="fusionrag_paper", recompute_ratio=0.0, max_new_tokens=2, variant_policy="overlap")
    assert paper.stats.variant_hits == {"fused": 2, "plain": 0} and paper.stats.fused_declined == 0
    assert chosen.stats.variant_hits == {"fused": 1, "plain": 1} and chosen.stats.fused_declined == 1
    together = TEXTS[:2] + TEXTS[2:]  # every neighbour present: nothing declined
    full = rag.generate(RAGRequest(chunks=together, question="Who?"), method="fusionrag_paper", recompute_ratio=0.0,
                        max_new_tokens=2, variant_policy="overlap")  # fmt: skip
    assert full.stats.variant_hits == {"fused": 3, "plain": 0} and full.stats.fused_declined == 0


def test_logits_follow_the_policy(rag):
    request = RAGRequest(chunks=[TEXTS[0], TEXTS[2]], question="Who runs the ferry?")  # chunk 2's neighbour absent
    plain = rag.logits(request, [5, 6], method="fusionrag_paper", recompute_ratio=0.0, kv_variant="plain")
    chosen = rag.logits(request, [5, 6], method="fusionrag_paper", recompute_ratio=0.0, variant_policy="overlap")
    paper = rag.logits(request, [5, 6], method="fusionrag_paper", recompute_ratio=0.0)
    assert (chosen - plain).abs().max() < 1e-5 < (paper - plain).abs().max()


@pytest.mark.parametrize("knobs, message", [
    (dict(method="fusionrag_paper", variant_policy="sometimes"), "valid: always, overlap, check"),
    (dict(method="full_reuse", variant_policy="overlap"), "needs kv_variant 'fused'"),
    (dict(method="fusionrag_paper", kv_variant="plain", variant_policy="overlap"), "needs kv_variant 'fused'"),
])  # fmt: skip
def test_the_validator_names_a_bad_policy(knobs, message):
    with pytest.raises(FusionRAGError, match=message):
        check_run_options(recompute_ratio=0.15, **knobs)
    assert check_run_options(method="full_reuse", recompute_ratio=0, variant_policy="always").variant_policy == "always"


def _stored(rag, token_ids):
    """The stored entries of a chunk, by variant."""
    found = {}
    for key in rag.store.keys():
        entry = rag.store.get(key, copy=False)[0]
        if entry.token_ids == tuple(token_ids) and entry.meta.get("variant") in ("fused", "plain"):
            found[entry.meta["variant"]] = entry
    return found


def _distance(entry, exact_keys, exact_values):
    layer = VARIANT_CHECK_LAYER
    return float(((entry.keys[layer] - exact_keys) ** 2).sum() + ((entry.values[layer] - exact_values) ** 2).sum())


def _second_chunk_exact(rag, request):
    """The request's second chunk segment, the prompt's exact (rotary-free) KV, and that chunk's span in it."""
    segments = rag.segments(request)
    ids = [token for segment in segments for token in segment.token_ids]
    second = [s for s in segments if s.kind == "chunk"][1]
    start = sum(len(s.token_ids) for s in segments[: segments.index(second)])
    exact = rag.parts.entries.computer.compute_exact(tuple(ids))
    return second, exact, slice(start, start + len(second.token_ids))


@pytest.mark.parametrize("chunks", [[0, 2], [3, 1], [1, 3], [2, 1]])
def test_check_keeps_the_variant_closer_to_the_exact_kv_and_changes_nothing_else(rag, chunks):
    """One chunk after the exact first one: the policy's choice is computed here independently (the
    prompt's exact KV, rotary-free, against each stored variant) and the run equals that variant's."""
    request = RAGRequest(chunks=[TEXTS[i] for i in chunks], question="Who is it about?")
    second, exact, span = _second_chunk_exact(rag, request)
    variants = _stored(rag, second.token_ids)
    near = {name: _distance(entry, exact.keys[VARIANT_CHECK_LAYER, :, span], exact.values[VARIANT_CHECK_LAYER, :, span])
            for name, entry in variants.items()}  # fmt: skip
    expected = "fused" if near["fused"] <= near["plain"] else "plain"
    checked = rag.generate(request, method="fusionrag_paper", recompute_ratio=0.0, max_new_tokens=2, variant_policy="check")
    assert checked.stats.variant_hits[expected] == 1 and checked.stats.fused_declined == (expected == "plain")
    targets = [5, 6]
    assert torch.equal(rag.logits(request, targets, method="fusionrag_paper", recompute_ratio=0.0, variant_policy="check"),
                       rag.logits(request, targets, method="fusionrag_paper", recompute_ratio=0.0, kv_variant=expected))


def _spoil(rag, variant, layers):
    """Add 50 to the keys of every stored entry of ``variant`` at ``layers``."""
    for key in rag.store.keys():
        entry = rag.store.get(key)[0]
        if entry.meta.get("variant") == variant:
            keys = entry.keys.clone()
            keys[layers] += 50.0
            rag.store.put(key, KVEntry(entry.token_ids, keys, entry.values, entry.meta))


def _spoiled_rag(layers):
    """A fresh engine over TEXTS whose fused entries' keys are 50 off at ``layers``."""
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    rag.add_chunks(TEXTS, embeddings=[[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], neighbors=1)
    _spoil(rag, "fused", layers)
    return rag


def _assert_spoiled_fused_entries_are_set_aside(rag, policy):
    """Chunk 2's neighbour (3) is absent: plain. Chunk 1's (0) is ahead of it: its fused entry serves
    it whatever the policy, as under "overlap"."""
    request = RAGRequest(chunks=[TEXTS[0], TEXTS[2], TEXTS[1]], question="Who runs the ferry?")
    chosen = rag.generate(request, method="fusionrag_paper", recompute_ratio=0.2, max_new_tokens=3, variant_policy=policy)
    expected = rag.generate(request, method="fusionrag_paper", recompute_ratio=0.2, max_new_tokens=3, variant_policy="overlap")
    assert chosen.stats.variant_hits == {"fused": 1, "plain": 1} and chosen.stats.fused_declined == 1
    assert chosen.stats.fused_in_context == 1
    assert chosen.token_ids == expected.token_ids
    assert torch.equal(rag.logits(request, [5, 6], method="fusionrag_paper", recompute_ratio=0.2, variant_policy=policy),
                       rag.logits(request, [5, 6], method="fusionrag_paper", recompute_ratio=0.2, variant_policy="overlap"))
    many = rag.generate_many([request, request], method="fusionrag_paper", recompute_ratio=0.2, max_new_tokens=3, variant_policy=policy)
    assert [m.token_ids for m in many] == [expected.token_ids] * 2


def test_check_declines_fused_entries_far_from_the_exact_kv():
    _assert_spoiled_fused_entries_are_set_aside(_spoiled_rag(VARIANT_CHECK_LAYER), "check")


def test_probe_declines_fused_entries_whose_upper_layers_are_far_off():
    layers = FusionRAG.from_pretrained("tiny", store=":memory:").engine.model.cfg.num_layers
    _assert_spoiled_fused_entries_are_set_aside(_spoiled_rag(slice(layers // 2, layers)), "probe")  # only what the probe compares


def test_probe_keeps_a_fused_entry_that_holds_this_prompts_exact_kv():
    """Chunk 1's fused entry is replaced by the exact KV it has in this very prompt: the probe, run over
    that context, reproduces it, so the fused entry stays; the run then equals Full Attention."""
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    rag.add_chunks(TEXTS, embeddings=[[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], neighbors=1)
    request = RAGRequest(chunks=[TEXTS[3], TEXTS[1]], question="Who keeps the lighthouse?")  # 1's neighbour absent
    second, exact, span = _second_chunk_exact(rag, request)
    for key in rag.store.keys():
        entry = rag.store.get(key)[0]
        if entry.token_ids == tuple(second.token_ids) and entry.meta.get("variant") == "fused":
            rag.store.put(key, KVEntry(entry.token_ids, exact.keys[:, :, span].clone(), exact.values[:, :, span].clone(), entry.meta))
    probed = rag.generate(request, method="fusionrag_paper", recompute_ratio=0.0, max_new_tokens=2, variant_policy="probe")
    assert probed.stats.variant_hits == {"fused": 1, "plain": 0} and probed.stats.fused_declined == 0
    targets = [5, 6]
    full = rag.logits(request, targets, method="full_attention")
    assert (rag.logits(request, targets, method="fusionrag_paper", recompute_ratio=0.0, variant_policy="probe") - full).abs().max() < 1e-4


def test_blend_serves_the_mean_of_the_fused_and_plain_kv():
    """Chunk 1's fused entry is replaced by 2 x (its exact KV in this prompt) - its plain entry: the blend
    of the two at VARIANT_BLEND = 0.5 is the exact KV, so the run at r = 0 equals Full Attention."""
    assert VARIANT_BLEND == 0.5
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    rag.add_chunks(TEXTS, embeddings=[[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], neighbors=1)
    request = RAGRequest(chunks=[TEXTS[3], TEXTS[1]], question="Who keeps the lighthouse?")  # 1's neighbour absent
    second, exact, span = _second_chunk_exact(rag, request)
    plain = _stored(rag, second.token_ids)["plain"]
    for key in rag.store.keys():
        entry = rag.store.get(key)[0]
        if entry.token_ids == tuple(second.token_ids) and entry.meta.get("variant") == "fused":
            keys, values = 2 * exact.keys[:, :, span] - plain.keys, 2 * exact.values[:, :, span] - plain.values
            rag.store.put(key, KVEntry(entry.token_ids, keys, values, entry.meta))
    targets = [5, 6]
    full = rag.logits(request, targets, method="full_attention")
    blended = rag.logits(request, targets, method="fusionrag_paper", recompute_ratio=0.0, variant_policy="blend")
    assert (blended - full).abs().max() < 1e-4
    fused = rag.logits(request, targets, method="fusionrag_paper", recompute_ratio=0.0)
    assert (fused - full).abs().max() > 1e-2  # the fused entry alone is far off
    out = rag.generate(request, method="fusionrag_paper", recompute_ratio=0.0, max_new_tokens=2, variant_policy="blend")
    assert out.stats.variant_hits == {"fused": 1, "plain": 0}


@pytest.mark.parametrize("policy", ["check", "probe", "blend"])
def test_a_chunk_after_its_own_neighbours_is_served_from_its_fused_entry_under_every_policy(policy):
    """Fused entries spoiled at every layer (each policy would turn from them): chunk 1 right after
    its neighbour 0 still gets its fused entry alone, exactly as under the paper's policy."""
    layers = FusionRAG.from_pretrained("tiny", store=":memory:").engine.model.cfg.num_layers
    rag = _spoiled_rag(slice(0, layers))
    request = RAGRequest(chunks=TEXTS[:2], question="Who keeps the lighthouse?")
    out = rag.generate(request, method="fusionrag_paper", recompute_ratio=0.0, max_new_tokens=2, variant_policy=policy)
    assert out.stats.variant_hits == {"fused": 1, "plain": 0} and out.stats.fused_in_context == 1
    assert out.stats.fused_declined == 0
    targets = [5, 6]
    assert torch.equal(rag.logits(request, targets, method="fusionrag_paper", recompute_ratio=0.0, variant_policy=policy),
                       rag.logits(request, targets, method="fusionrag_paper", recompute_ratio=0.0))
    apart = RAGRequest(chunks=[TEXTS[3], TEXTS[1]], question="Who keeps the lighthouse?")  # its neighbour absent
    assert not torch.equal(rag.logits(apart, targets, method="fusionrag_paper", recompute_ratio=0.0, variant_policy=policy),
                           rag.logits(apart, targets, method="fusionrag_paper", recompute_ratio=0.0))


ORDERED = ["Ada builds the bridge.", "Ben paints the bridge.", "Cy crosses the bridge."]


@pytest.mark.parametrize("fused_order, in_place, apart", [
    ("similar_first", [0, 1, 2], [1, 0, 2]),  # chunk 2's neighbours, most similar first: 0 then 1
    ("similar_last", [1, 0, 2], [0, 1, 2]),
])  # fmt: skip
def test_the_neighbours_must_be_ahead_in_the_order_they_were_placed(fused_order, in_place, apart):
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    rag.add_chunks(ORDERED, embeddings=[[1, 0], [0.6, 0.8], [0.95, 0.31]], neighbors=2, fused_order=fused_order)
    def served(order):
        request = RAGRequest(chunks=[ORDERED[i] for i in order], question="Who?")
        return rag.generate(request, method="fusionrag_paper", recompute_ratio=0.0, max_new_tokens=1, variant_policy="blend").stats
    assert served(in_place).fused_in_context == 1  # chunk 2 (chunk 1's neighbours include the absent chunk 2)
    assert served(apart).fused_in_context == 0
