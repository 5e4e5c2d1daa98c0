"""The question-attention scorers of FusionRAG (the upper half of the layers, ``fusionrag``) and of
the paper (the last layer, ``fusionrag_paper``), and CacheClip's 8-token groups: each picks k reused
slots, and the scorers that are one forward pass run as one batched forward (``select_many``) with the
same picks as the engine made one request at a time."""

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest, get_method
from fusionrag_llm.fusion.layout import RequestLayout, ScoringInput
from fusionrag_llm.fusion.scorers.shaping import group_ids
from fusionrag_llm.methods.base import select_many
from method_spy import spy

QUESTION_GUIDED = ["fusionrag", "fusionrag_paper"]
CHUNKS = [
    "The river Sel floods the lower town of Brightwater every spring after the snow melts in the hills.",
    "Brightwater's mayor in 1901 was Ida Renn, who built the first stone embankment along the river.",
    "Renn's embankment was rebuilt in 1950 after a storm broke its eastern wall near the old mill.",
]
REQUEST = RAGRequest(chunks=CHUNKS, question="Who built the embankment, and when was it rebuilt?")


def layout(spans):
    """Chunks at ``spans`` ([start, end) positions), fresh tokens elsewhere, a 3-token suffix."""
    end = spans[-1][1] + 3
    reused = torch.cat([torch.arange(s, e) for s, e in spans])
    fresh = torch.tensor([p for p in range(end) if not any(s <= p < e for s, e in spans)])
    return RequestLayout(torch.zeros(end, dtype=torch.long), reused, fresh, fresh[-3:], tuple(spans))


def test_groups_are_runs_of_eight_inside_one_chunk():
    lay = layout([(2, 21), (23, 30)])  # 19 and 7 reused tokens
    assert group_ids(lay).tolist() == [0] * 8 + [1] * 8 + [2] * 3 + [3] * 7


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.8, 0.6], [0.6, 0.8]], neighbors=2)
    return rag


def selected(rag, method, ratio=0.2):
    """What the engine handed ``method``'s run for REQUEST at ``ratio``, and the run's output."""
    method, seen = spy(method)
    out = rag.generate(REQUEST, method=method, recompute_ratio=ratio, max_new_tokens=2)
    return seen[0], out


@pytest.mark.parametrize("method", QUESTION_GUIDED)
def test_each_scorer_selects_k_reused_tokens_and_runs_end_to_end(rag, method):
    seen, out = selected(rag, method)
    picked, reused = seen.prefill.selected, seen.layout.reused_slots
    k = round(0.2 * len(reused))
    assert k > 0 and len(picked) == k and bool(torch.isin(picked, reused).all())
    assert picked.tolist() == sorted(set(picked.tolist()))
    assert out.stats.recomputed_tokens == k
    exact = rag.generate(REQUEST, method="full_attention", max_new_tokens=4).token_ids
    assert rag.generate(REQUEST, method=method, recompute_ratio=1.0, max_new_tokens=4).token_ids == exact


def test_the_two_scorers_read_different_layers(rag):
    upper, _ = selected(rag, "fusionrag")
    last, _ = selected(rag, "fusionrag_paper")
    inp = ScoringInput(rag.engine.model, upper.placed, upper.layout)
    assert not torch.allclose(get_method("fusionrag").scores(inp), get_method("fusionrag_paper").scores(inp))


def test_scorers_of_one_forward_batch_and_pick_what_the_engine_picked(rag):
    runs = [selected(rag, method)[0] for method in QUESTION_GUIDED * 2]
    jobs = [(get_method(method), len(seen.prefill.selected), ScoringInput(rag.engine.model, seen.placed.fork(), seen.layout))
            for method, seen in zip(QUESTION_GUIDED * 2, runs)]  # fmt: skip
    calls = []
    original = rag.engine.model.forward_batch
    rag.engine.model.forward_batch = lambda steps, caches: calls.append(len(steps)) or original(steps, caches)
    try:
        together = select_many(jobs, rag.engine.model)
    finally:
        del rag.engine.model.forward_batch
    assert calls == [4]  # one batched forward for the four sequences
    for seen, picked in zip(runs, together):
        assert picked.tolist() == seen.prefill.selected.tolist()


def test_a_method_without_a_scorer_or_budget_selects_nothing(rag):
    seen, _ = selected(rag, "fusionrag")
    inp = ScoringInput(rag.engine.model, seen.placed, seen.layout)
    reused = seen.layout.reused_slots
    picks = select_many([(get_method("full_reuse"), 5, inp), (get_method("fusionrag"), 0, inp),
                         (get_method("fusionrag"), len(reused) + 3, inp)], rag.engine.model)  # fmt: skip
    assert [len(p) for p in picks] == [0, 0, len(reused)] and torch.equal(picks[2], reused)
