"""The engine's invariants (docs/methods.md) on the tiny model."""

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest, get_method, method_names

CHUNKS = [
    "The lighthouse at Keldmouth was designed by the engineer Tamsin Orrery in 1872.",
    "Tamsin Orrery was born in Brightwater, a city at the mouth of the river Sel.",
    "Brightwater is the capital of Lowmarch, a flat province crossed by canals.",
    "Sheep on the island of Varrow graze the cliffs all year round, even in winter.",
]
EMBEDDINGS = [[1, 0.2, 0], [0.9, 0.4, 0], [0.7, 0.7, 0], [0, 0.1, 1]]
REQUEST = RAGRequest(chunks=[CHUNKS[2], CHUNKS[0], CHUNKS[1]], question="Where was the lighthouse designer born?")
# every registered method that picks tokens to recompute: at r = 1 it must be Full Attention
SELECTING = [name for name in method_names() if get_method(name).selects]
# CacheClip recomputes at most k (its 8-token windows drop some picks), so only r = 1 is exact about counts
PARTIAL = [name for name in SELECTING if name != "cacheclip"]


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    return rag


@pytest.fixture(scope="module")
def full(rag):
    out = rag.generate(REQUEST, method="full_attention", max_new_tokens=10)
    return out, rag.logits(REQUEST, out.token_ids, method="full_attention")


def test_every_built_in_selecting_method_is_checked():
    assert set(SELECTING) >= {"cacheblend", "fusionrag", "fusionrag_paper", "a3", "epic", "cacheclip", "cache_craft"}


@pytest.mark.parametrize("method", SELECTING)
def test_ratio_one_equals_full_attention(rag, full, method):
    reference, reference_logits = full
    knobs = dict(method=method, recompute_ratio=1.0)
    out = rag.generate(REQUEST, max_new_tokens=10, **knobs)
    logits = rag.logits(REQUEST, reference.token_ids, **knobs)
    assert (logits - reference_logits).abs().max().item() <= 1e-4
    assert out.token_ids == reference.token_ids and out.prompt_ids == reference.prompt_ids
    assert out.stats.reused_tokens == 0 and out.stats.recomputed_tokens > 0


@pytest.mark.parametrize("method", PARTIAL)
def test_partial_ratio_differs_and_counts_add_up(rag, full, method):
    reference, reference_logits = full
    knobs = dict(method=method, recompute_ratio=0.3)
    out = rag.generate(REQUEST, max_new_tokens=4, **knobs)
    chunks = [s for s in out.segments if s.kind == "chunk"]
    reusable = sum(len(s.token_ids) for s in chunks[1:])  # the first chunk follows S0: its plain entry is exact
    assert out.stats.recomputed_tokens == round(0.3 * reusable)
    assert out.stats.reused_tokens + out.stats.recomputed_tokens == reusable
    assert out.stats.path_hits == {"exact": 1, "chunk": 2, "miss": 0}
    logits = rag.logits(REQUEST, reference.token_ids, **knobs)
    assert (logits - reference_logits).abs().max().item() > 1e-3  # approximate, not secretly exact


def test_first_chunk_after_the_canonical_prefix_is_exact_and_never_selected(rag, full):
    reference, reference_logits = full
    out = rag.generate(REQUEST, method="fusionrag", recompute_ratio=0.3, max_new_tokens=2)
    first = [s for s in out.segments if s.kind == "chunk"][0]
    assert out.stats.path_hits["exact"] == 1
    prefix_len = len(out.segments[0].token_ids)
    captured = []
    original = rag.engine.model.forward

    def spy(step, cache):
        captured.append(step.positions.clone())
        return original(step, cache)

    rag.engine.model.forward = spy
    try:
        rag.generate(REQUEST, method="fusionrag", recompute_ratio=1.0, max_new_tokens=1)
    finally:
        del rag.engine.model.forward
    recomputed = set(captured[-1].tolist())  # r = 1 and one new token: the last call is the sparse prefill
    assert not recomputed & set(range(prefix_len, prefix_len + len(first.token_ids)))


@pytest.mark.parametrize("system", [None, "You answer in one word."])
def test_one_plain_chunk_at_ratio_zero_equals_full_attention(system):
    """With the canonical prefix the chunk's plain entry is exact; after another system prompt it is
    reused (approximate) and only equals Full Attention up to the changed prefix's influence."""
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    request = RAGRequest(chunks=[CHUNKS[0]], question="Who designed it?", system=system)
    rag.add_chunks([CHUNKS[0]], fuse=False, embeddings=[[1.0, 0.0]])
    reference = rag.generate(request, method="full_attention", max_new_tokens=8)
    out = rag.generate(request, method="full_reuse", max_new_tokens=8)
    logits = rag.logits(request, reference.token_ids, method="full_reuse")
    reference_logits = rag.logits(request, reference.token_ids, method="full_attention")
    difference = (logits - reference_logits).abs().max().item()
    if system is None:
        assert out.stats.path_hits["exact"] == 1 and out.stats.reused_tokens == 0
        assert difference <= 1e-4 and out.token_ids == reference.token_ids
    else:
        assert out.stats.path_hits["chunk"] == 1 and out.stats.reused_tokens == len(rag.tokenizer.encode(CHUNKS[0]))
        assert difference > 1e-3


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
    for method in method_names():
        rag.generate(REQUEST, method=method, recompute_ratio=0.5, max_new_tokens=3)
    after = _snapshot(rag)
    assert before.keys() == after.keys()
    assert all(before[key].bitwise_equal(after[key]) for key in before)


def test_recomputed_tokens_see_only_earlier_positions(rag):
    """A recomputed token's output does not depend on anything placed after it."""
    early = RAGRequest(chunks=[CHUNKS[3], CHUNKS[0], CHUNKS[1]], question="Where?")
    changed = RAGRequest(chunks=[CHUNKS[3], CHUNKS[0], CHUNKS[2]], question="Where?")
    captured = []
    original = rag.engine.model.forward

    def spy(step, cache):
        out = original(step, cache)
        captured.append((step.positions.clone(), cache.values[:, :, : cache.length].clone()))
        return out

    rag.engine.model.forward = spy
    try:
        for request in (early, changed):
            rag.generate(request, method="cacheblend", recompute_ratio=1.0, max_new_tokens=1)
    finally:
        del rag.engine.model.forward
    assert len(captured) == 2  # at r = 1 nothing is scored: one sparse prefill per request
    (positions_a, values_a), (positions_b, values_b) = captured
    segments = rag.segments(early)
    start = len(segments[0].token_ids) + len(segments[1].token_ids) + len(segments[2].token_ids)  # after "\n\n"
    end = start + len(segments[3].token_ids)  # the second chunk, CHUNKS[0]
    assert set(range(start, end)) <= set(positions_a.tolist())  # it was recomputed in both runs
    assert torch.allclose(values_a[:, :, :end], values_b[:, :, :end], atol=1e-6)
    assert not torch.allclose(values_a[:, :, end + 2 : end + 8], values_b[:, :, end + 2 : end + 8])


def test_miss_computes_and_stores_the_plain_entry(rag):
    unseen = "An unregistered chunk about the ferry timetable of Keldmouth harbour."
    request = RAGRequest(chunks=[CHUNKS[0], unseen, CHUNKS[1]], question="When do ferries leave?")
    first = rag.generate(request, method="fusionrag", max_new_tokens=2)
    assert first.stats.path_hits == {"exact": 1, "chunk": 1, "miss": 1}
    assert first.stats.variant_hits == {"fused": 1, "plain": 0}
    second = rag.generate(request, method="fusionrag", max_new_tokens=2)
    assert second.stats.path_hits == {"exact": 1, "chunk": 2, "miss": 0}
    assert second.stats.variant_hits == {"fused": 1, "plain": 1}  # the missed chunk has no fused entry
    assert first.text == second.text
