"""Segmentation of requests and flat prompts; the offline stage; input validation."""

import pytest

from fusionrag_llm import FusionRAG, FusionRAGError, RAGRequest
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.fusion.chunk_finder import WINDOW, ChunkFinder
from fusionrag_llm.errors import PromptTooLongError

CHUNKS = [
    "Keldmouth is the only town on the island of Varrow, on its east coast.",
    "Ferries to the mainland leave Keldmouth twice a day in the summer months.",
    "The wool market of Varrow takes place every September in Keldmouth.",
]


@pytest.fixture()
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:")
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.8, 0.6], [0, 1]], neighbors=1)
    return rag


def test_chunk_finder_splits_out_registered_texts_longest_first():
    finder = ChunkFinder()
    finder.register(["a registered chunk of text", "a registered chunk of text, longer", "tiny"])
    prompt = "before a registered chunk of text, longer and a registered chunk of text!"
    assert finder.split(prompt) == [
        ("text", "before "),
        ("chunk", "a registered chunk of text, longer"),
        ("text", " and "),
        ("chunk", "a registered chunk of text"),
        ("text", "!"),
    ]
    assert "tiny" not in finder and len("tiny") < WINDOW  # too short to be found by content
    assert finder.split("nothing here at all, really nothing") == [("text", "nothing here at all, really nothing")]


def test_flat_prompt_with_registered_chunks_equals_the_request(rag):
    request = RAGRequest(chunks=[CHUNKS[2], CHUNKS[0]], question="When is the wool market?")
    flat = "".join(text for _, text in request.pieces())
    assert [s.token_ids for s in rag.segments(flat)] == [s.token_ids for s in rag.segments(request)]
    assert [s.kind for s in rag.segments(flat)] == ["prefix", "chunk", "text", "chunk", "suffix"]
    a = rag.generate(flat, method="fusionrag", recompute_ratio=0.2, max_new_tokens=6)
    b = rag.generate(request, method="fusionrag", recompute_ratio=0.2, max_new_tokens=6)
    assert a.prompt_ids == b.prompt_ids and a.token_ids == b.token_ids
    assert a.stats.path_hits == b.stats.path_hits == {"exact": 1, "chunk": 1, "miss": 0}


def test_chunk_token_ids_are_the_same_at_ingestion_and_query_time(rag):
    request = RAGRequest(chunks=CHUNKS, question="Which town?")
    chunk_segments = [s for s in rag.segments(request) if s.kind == "chunk"]
    assert [s.token_ids for s in chunk_segments] == [rag.chunks[chunk_id_of(t)].token_ids for t in CHUNKS]


def test_add_chunks_is_idempotent_and_fuses_with_nearest_neighbours(rag):
    report = rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.8, 0.6], [0, 1]], neighbors=1)
    assert (report.plain_computed, report.fused_computed) == (0, 0)
    fused = rag.stored(report[0], "fused").entry
    assert fused.meta["neighbours"] == [report[1]] and rag.chunks[report[0]].neighbor_ids == (report[1],)
    plain = rag.stored(report[0], "plain").entry
    assert not plain.bitwise_equal(fused)
    more = rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.8, 0.6], [0, 1]], neighbors=2)
    assert (more.plain_computed, more.fused_computed) == (0, 3)  # a wider neighbourhood re-fuses


def test_add_chunks_with_the_default_embedding_model_and_faiss():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:")
    texts = [
        "The cat sat on the warm mat and purred all afternoon long.",
        "Stock markets fell sharply after the central bank raised rates.",
        "A kitten curled up on the rug and fell asleep in the sun.",
    ]
    ids = rag.add_chunks(texts, neighbors=1)
    assert len(ids) == 3 and len(set(ids)) == 3
    assert rag.chunks[ids[0]].neighbor_ids == (ids[2],)  # the kitten, found by the packaged model and FAISS


def test_bad_inputs(rag):
    with pytest.raises(ValueError, match="valid methods: full_attention, full_reuse, cacheblend, fusionrag"):
        rag.generate("hi", method="blend")
    with pytest.raises(ValueError, match="unknown method None; valid methods: full_attention"):
        rag.generate("hi", method=None)
    for ratio in (-0.1, 1.5, "half", True):
        with pytest.raises(ValueError, match=r"recompute_ratio must be a number in \[0, 1\]"):
            rag.generate("hi", recompute_ratio=ratio)
    with pytest.raises(FusionRAGError, match="question must be a non-empty"):
        rag.generate(RAGRequest(chunks=CHUNKS, question="  "))
    with pytest.raises(PromptTooLongError, match="context window"):
        rag.generate(RAGRequest(chunks=["x" * 3000, "y" * 3000], question="q"))
    with pytest.raises(PromptTooLongError, match="split it into smaller chunks"):
        rag.add_chunks(["z" * 5000], embeddings=[[1, 0]])
    with pytest.raises(FusionRAGError, match="embeddings must have shape"):
        rag.add_chunks(["a new chunk of some length here"], embeddings=[[1, 0], [0, 1]])
    with pytest.raises(FusionRAGError, match=r"texts\[0\] must be a non-empty string"):
        rag.add_chunks([""])
    with pytest.raises(FusionRAGError, match="neighbors"):
        rag.add_chunks(CHUNKS, neighbors=-1)
    with pytest.raises(FusionRAGError, match="last chat message"):
        rag.generate([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    assert len(rag.chunks) == 3  # failed calls registered nothing


def test_chat_messages_find_chunks_in_any_message(rag):
    messages = [
        {"role": "system", "content": "Use this context:\n" + CHUNKS[1]},
        {"role": "user", "content": "When do ferries leave?"},
    ]
    out = rag.generate(messages, method="fusionrag", max_new_tokens=3)
    assert [s.kind for s in out.segments] == ["prefix", "chunk", "suffix"]
    assert out.stats.path_hits["chunk"] == 1


def test_chunks_embedded_differently_are_kept_apart_and_reloaded(tmp_path):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path)
    ids = rag.add_chunks(CHUNKS[:2], embeddings=[[1, 0], [1, 0.1]], neighbors=5)
    other = ["A chunk embedded in a three-dimensional space, far away.", "Another chunk in that space, nearby."]
    other_ids = rag.add_chunks(other, embeddings=[[0, 0, 1], [0, 0.1, 1]], neighbors=5)
    assert rag.chunks[other_ids[0]].neighbor_ids == (other_ids[1],)  # 5 asked for, one in its space
    reopened = FusionRAG.from_pretrained("tiny", store=tmp_path)
    assert len(reopened.chunks) == 4
    # the reloaded index finds the same neighbours (else the entries would be fused again, with others)
    assert reopened.add_chunks(CHUNKS[:2], neighbors=6).fused_computed == 0
    assert reopened.chunks[ids[0]].neighbor_ids == (ids[1],)
    flat = "Context: " + other[1] + " Question: what?"
    assert [s.kind for s in reopened.segments(flat)] == ["prefix", "chunk", "suffix"]


def test_stream_deltas_add_up_to_the_text_even_when_cut_mid_character(rag):
    for tokens in range(1, 12):
        stream = rag.stream("Reply with an accented word: é", method="full_attention", max_new_tokens=tokens)
        assert "".join(stream) == stream.text
