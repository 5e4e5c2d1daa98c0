"""DESIGN.md section 4 invariants on the tiny model."""

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest

CHUNKS = [
    "The lighthouse at Keldmouth was designed by the engineer Tamsin Orrery in 1872.",
    "Tamsin Orrery was born in Brightwater, a city at the mouth of the river Sel.",
    "Brightwater is the capital of Lowmarch, a flat province crossed by canals.",
    "Sheep on the island of Varrow graze the cliffs all year round, even in winter.",
]
EMBEDDINGS = [[1, 0.2, 0], [0.9, 0.4, 0], [0.7, 0.7, 0], [0, 0.1, 1]]
REQUEST = RAGRequest(chunks=[CHUNKS[2], CHUNKS[0], CHUNKS[1]], question="Where was the lighthouse designer born?")
ABLATIONS = [
    ("cacheblend", None, None),
    ("fusionrag", None, None),
    ("fusionrag", "plain", "query_guided"),
    ("fusionrag", "fused", "kv_deviation"),
    ("cacheblend", "plain", "random"),
    ("fusionrag", "fused", "oracle"),
]


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    return rag


@pytest.fixture(scope="module")
def full(rag):
    out = rag.generate(REQUEST, method="full_attention", max_new_tokens=10)
    return out, rag.logits(REQUEST, out.token_ids, method="full_attention")


@pytest.mark.parametrize("method, kv_variant, selector", ABLATIONS)
def test_ratio_one_equals_full_attention(rag, full, method, kv_variant, selector):
    reference, reference_logits = full
    knobs = dict(method=method, recompute_ratio=1.0, kv_variant=kv_variant, selector=selector)
    out = rag.generate(REQUEST, max_new_tokens=10, **knobs)
    logits = rag.logits(REQUEST, reference.token_ids, **knobs)
    assert (logits - reference_logits).abs().max().item() <= 1e-4
    assert out.token_ids == reference.token_ids and out.prompt_ids == reference.prompt_ids
    assert out.stats.reused_tokens == 0 and out.stats.recomputed_tokens > 0


@pytest.mark.parametrize("method, kv_variant, selector", ABLATIONS)
def test_partial_ratio_differs_and_counts_add_up(rag, full, method, kv_variant, selector):
    reference, reference_logits = full
    knobs = dict(method=method, recompute_ratio=0.3, kv_variant=kv_variant, selector=selector)
    out = rag.generate(REQUEST, max_new_tokens=4, **knobs)
    chunk_tokens = sum(len(s.token_ids) for s in out.segments if s.kind == "chunk")
    assert out.stats.recomputed_tokens == round(0.3 * chunk_tokens)
    assert out.stats.reused_tokens + out.stats.recomputed_tokens == chunk_tokens
    assert out.stats.path_hits == {"exact": 0, "chunk": 3, "miss": 0}
    logits = rag.logits(REQUEST, reference.token_ids, **knobs)
    assert (logits - reference_logits).abs().max().item() > 1e-3  # approximate, not secretly exact


def test_one_plain_chunk_at_ratio_zero_equals_full_attention():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    request = RAGRequest(chunks=[CHUNKS[0]], question="Who designed it?")
    rag.add_chunks([CHUNKS[0]], fuse=False, embeddings=[[1.0, 0.0]])
    reference = rag.generate(request, method="full_attention", max_new_tokens=8)
    out = rag.generate(request, method="full_reuse", max_new_tokens=8)
    assert out.stats.reused_tokens == len(rag.tokenizer.encode(CHUNKS[0])) and out.stats.recomputed_tokens == 0
    logits = rag.logits(request, reference.token_ids, method="full_reuse")
    reference_logits = rag.logits(request, reference.token_ids, method="full_attention")
    assert (logits - reference_logits).abs().max().item() <= 1e-4
    assert out.token_ids == reference.token_ids


def _snapshot(rag):
    snapshot = {}
    for key in rag.store.keys():
        entry, _ = rag.store.get(key)
        snapshot[key] = entry
    return snapshot


def test_reused_entries_are_untouched_by_requests(rag):
    before = _snapshot(rag)
    variants = sorted(entry.meta["variant"] for entry in before.values())
    assert variants == ["fused"] * 4 + ["path"] + ["plain"] * 4  # each chunk's two variants and the prefix
    for method, kv_variant, selector in ABLATIONS:
        rag.generate(REQUEST, method=method, recompute_ratio=0.5, kv_variant=kv_variant, selector=selector, max_new_tokens=3)
    rag.generate(REQUEST, method="full_reuse", max_new_tokens=3)
    after = _snapshot(rag)
    assert before.keys() == after.keys()
    assert all(before[key].bitwise_equal(after[key]) for key in before)


def test_recomputed_tokens_see_only_earlier_positions(rag):
    """A recomputed token's output does not depend on anything placed after it."""
    early = RAGRequest(chunks=[CHUNKS[0], CHUNKS[1]], question="Where?")
    changed = RAGRequest(chunks=[CHUNKS[0], CHUNKS[3]], question="Where?")
    captured = []
    original = rag.engine.model.forward

    def spy(step, cache):
        out = original(step, cache)
        if len(step.token_ids) > 20:  # the sparse prefill (the selection pass runs fewer tokens)
            captured.append((step.positions.clone(), cache.values[:, :, : cache.length].clone()))
        return out

    rag.engine.model.forward = spy
    try:
        for request in (early, changed):
            rag.generate(request, method="cacheblend", recompute_ratio=1.0, max_new_tokens=1)
    finally:
        del rag.engine.model.forward
    (positions_a, values_a), (positions_b, values_b) = captured[-2:]
    first_chunk_end = len(rag.segments(early)[0].token_ids) + len(rag.tokenizer.encode(CHUNKS[0]))
    # every slot of the first chunk was recomputed in both runs and must agree bit for bit (to fp32 noise)
    assert set(range(len(rag.segments(early)[0].token_ids), first_chunk_end)) <= set(positions_a.tolist())
    assert torch.allclose(values_a[:, :, :first_chunk_end], values_b[:, :, :first_chunk_end], atol=1e-6)
    assert not torch.allclose(values_a[:, :, first_chunk_end : first_chunk_end + 5], values_b[:, :, first_chunk_end : first_chunk_end + 5])


def test_miss_computes_and_stores_the_plain_entry(rag):
    unseen = "An unregistered chunk about the ferry timetable of Keldmouth harbour."
    request = RAGRequest(chunks=[CHUNKS[0], unseen], question="When do ferries leave?")
    first = rag.generate(request, method="fusionrag", max_new_tokens=2)
    assert first.stats.path_hits == {"exact": 0, "chunk": 1, "miss": 1}
    second = rag.generate(request, method="fusionrag", max_new_tokens=2)
    assert second.stats.path_hits == {"exact": 0, "chunk": 2, "miss": 0}
    assert first.text == second.text
