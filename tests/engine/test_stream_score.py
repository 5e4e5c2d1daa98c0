"""Scoring a continuation over a finished stream's prefill equals a separate teacher-forced run."""

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.errors import FusionRAGError

CHUNKS = [
    "The river Sel floods the lower town of Brightwater every spring after the snow melts.",
    "Brightwater's mayor in 1901 was Ida Renn, who built the first stone embankment.",
    "Renn's embankment was rebuilt in 1950 after a storm broke its eastern wall.",
]
REQUEST = RAGRequest(chunks=[CHUNKS[1], CHUNKS[2], CHUNKS[0]], question="Who built the embankment?")


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.8, 0.6], [0.6, 0.8]], neighbors=2)
    return rag


@pytest.mark.parametrize("method, ratio", [("full_attention", 1.0), ("full_reuse", 0.0), ("cacheblend", 0.15),
                                           ("fusionrag", 0.3)])  # fmt: skip
def test_score_matches_teacher_forced_logits(rag, method, ratio):
    reference = rag.generate(REQUEST, method="full_attention", max_new_tokens=6)
    stream = rag.stream(REQUEST, method=method, recompute_ratio=ratio, max_new_tokens=6)
    text = "".join(stream)
    alone = rag.generate(REQUEST, method=method, recompute_ratio=ratio, max_new_tokens=6)
    assert text == alone.text and stream.token_ids == alone.token_ids

    ids = reference.token_ids
    scored = stream.score(ids)
    expected = rag.logits(REQUEST, ids, method=method, recompute_ratio=ratio)[: len(ids)]
    assert scored.shape == expected.shape == (len(ids), expected.shape[1])
    torch.testing.assert_close(scored, expected, atol=1e-5, rtol=1e-5)


def test_score_of_nothing_is_the_first_row_and_too_long_is_refused(rag):
    stream = rag.stream(REQUEST, method="fusionrag", max_new_tokens=3)
    list(stream)
    first = stream.score([])
    assert first.shape[0] == 1
    torch.testing.assert_close(first[0], rag.logits(REQUEST, [], method="fusionrag")[0])
    with pytest.raises(FusionRAGError, match="room for 4"):
        stream.score([5] * 5)
    assert stream.score([5] * 4).shape[0] == 4


def test_score_ends_the_stream(rag):
    stream = rag.stream(REQUEST, method="full_attention", max_new_tokens=8)
    deltas = iter(stream)
    next(deltas)
    assert len(stream.token_ids) < rag.generate(REQUEST, method="full_attention", max_new_tokens=8).stats.generated_tokens
    stream.score([1, 2])
    taken = len(stream.token_ids)
    assert list(deltas) == [] and len(stream.token_ids) == taken
