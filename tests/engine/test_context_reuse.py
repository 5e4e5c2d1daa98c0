"""RAGBoost on the engine: context ordering with order hints, multi-turn de-duplication with
location hints; each rule checked by hand, and the reuse it buys shown in the stats."""

import pytest

from fusionrag_llm import FusionRAG, RAGRequest, RAGSession
from fusionrag_llm.engine.context_index import ContextIndex, order_hint
from fusionrag_llm.errors import FusionRAGError

CHUNKS = [f"Fact {n}: the station at post {n} was built in {1800 + 7 * n} by crew {n % 3}." for n in range(10)]


def _ordered(index: ContextIndex, ids: list[int]) -> list[int]:
    return [ids[position] for position in index.order([str(i) for i in ids])]


def test_the_papers_example_orders_as_the_paper_says():
    index = ContextIndex()
    for context in ([1, 2, 3], [1, 2, 6], [1, 4, 0]):  # earlier contexts, already ordered
        assert _ordered(index, context) == context
    assert _ordered(index, [2, 1, 4]) == [1, 2, 4]  # follows the path 1 -> 2 taken twice
    assert _ordered(index, [5, 7, 8]) == [5, 7, 8]  # nothing shared: retrieval order kept
    assert _ordered(index, [1, 2, 9]) == [1, 2, 9]
    assert _ordered(index, [9, 4, 1]) == [1, 4, 9]  # 1 -> 4 is on a recorded path, 1 -> 9 is not
    assert _ordered(index, [4, 3, 2, 1]) == [1, 2, 4, 3]  # 1 -> 2 -> 4 was recorded above


def test_the_order_hint_names_documents_in_their_original_ranking():
    assert order_hint([0, 1, 2], "[Doc_{n}] ") is None and order_hint([0, 1]) is None  # unchanged order: no hint
    assert order_hint([1, 0]) == ("Please read the context in the following priority order: document 2 >> document 1 "
                                  "and answer the question.")  # fmt: skip
    # retrieved (C, B, A), placed (A, B, C): A is Doc_1, B Doc_2, C Doc_3; the retriever ranked C first
    assert order_hint([2, 1, 0], "[Doc_{n}] ") == (
        "Please read the context in the following priority order: [Doc_3] >> [Doc_2] >> [Doc_1] and answer the question.")


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"turn_cache_gib": 0.1})
    rag.add_chunks(CHUNKS, embeddings=[[1, n / 10] for n in range(10)], neighbors=2, fuse=False)
    return rag


def test_reordering_makes_requests_that_share_chunks_share_a_cached_prefix(rag):
    first = RAGRequest(chunks=[CHUNKS[1], CHUNKS[2], CHUNKS[3]], question="When was post 1 built?")
    second = RAGRequest(chunks=[CHUNKS[2], CHUNKS[1], CHUNKS[5]], question="When was post 5 built?")
    plain = FusionRAG.from_pretrained("tiny", store=":memory:")
    plain.add_chunks(CHUNKS, embeddings=[[1, n / 10] for n in range(10)], neighbors=2, fuse=False)
    plain.generate(first, method="full_attention", max_new_tokens=2)
    as_retrieved = plain.generate(second, method="full_attention", max_new_tokens=2)
    rag.generate(rag.ordered(first), method="full_attention", max_new_tokens=2)
    reordered = rag.generate(rag.ordered(second), method="full_attention", max_new_tokens=2)
    assert reordered.stats.exact_tokens > as_retrieved.stats.exact_tokens + 2 * 20  # two chunks' worth more
    text = rag.tokenizer.decode(reordered.prompt_ids)
    assert text.index(CHUNKS[1]) < text.index(CHUNKS[2]) < text.index(CHUNKS[5])
    assert "document 2 >> document 1 >> document 3" in text  # the retriever ranked post 2's fact first


def test_ordering_needs_a_rag_request(rag):
    with pytest.raises(FusionRAGError, match="needs a RAGRequest"):
        rag.ordered("hi")


def test_a_chunk_given_again_is_a_location_hint_and_the_turn_computes_only_new_tokens(rag):
    session = RAGSession(rag)
    session.ask([CHUNKS[6], CHUNKS[7]], "Which crew built post 6?", method="full_attention", max_new_tokens=3,
                sampling={"ignore_eos": True})  # fmt: skip
    second = session.ask([CHUNKS[7], CHUNKS[8]], "And post 8?", method="full_attention", max_new_tokens=3)
    turn = session.messages[-2]["content"]
    assert "Please refer to [Doc_2] in the previous conversation." in turn and CHUNKS[7] not in turn
    assert "[Doc_3]\n" + CHUNKS[8] in turn and session.deduplicated == 1
    assert second.stats.turn_tokens > 0
    assert second.stats.computed_tokens == second.stats.prompt_tokens - second.stats.turn_tokens
    repeated = RAGSession(rag, dedupe=False)
    repeated.ask([CHUNKS[6]], "Post 6?", max_new_tokens=2)
    repeated.ask([CHUNKS[6]], "Again?", max_new_tokens=2)
    assert repeated.messages[-2]["content"].count(CHUNKS[6]) == 1 and repeated.deduplicated == 0


def test_a_session_checks_its_input(rag):
    with pytest.raises(FusionRAGError, match="dedupe must be True or False"):
        RAGSession(rag, dedupe=1)
    with pytest.raises(FusionRAGError, match="question must be a non-empty string"):
        RAGSession(rag).ask([CHUNKS[0]], "  ")


def test_a_turn_hit_ending_inside_a_chunk_stops_at_the_chunk_so_its_entry_serves_it():
    from fusionrag_llm.engine.connector import chunk_aligned
    from fusionrag_llm.request import Segment

    segments = [Segment("prefix", "", (1, 2, 3)), Segment("chunk", "", (4, 5, 6, 7)), Segment("text", "", (8, 9)),
                Segment("suffix", "", (10,))]  # fmt: skip
    assert [chunk_aligned(segments, n) for n in (2, 3, 4, 6, 7, 8, 9)] == [2, 3, 3, 3, 7, 8, 9]
