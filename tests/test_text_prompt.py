"""Raw prompts (the completions API): no chat template, registered chunks still found and reused."""

import pytest

from fusionrag_llm import FusionRAG, TextPrompt
from fusionrag_llm.errors import FusionRAGError

CHUNKS = [
    "The lighthouse at Carrow Point was lit for the first time in 1862.",
    "Its keeper, Tomas Vell, kept a log of every ship that passed the point.",
]


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:")
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.6, 0.8]], neighbors=1)
    return rag


def test_the_prompt_is_exactly_its_text(rag):
    text = f"Context: {CHUNKS[0]}\n{CHUNKS[1]}\nQ: Who kept the log? A:"
    out = rag.generate(TextPrompt(text), max_new_tokens=2)
    assert out.prompt_ids == rag.tokenizer.encode(text)  # no template, no special tokens
    assert [s.kind for s in rag.segments(TextPrompt(text))] == ["prefix", "chunk", "text", "chunk", "suffix"]


def test_a_chunk_at_either_end_is_read_as_text_and_nothing_changes_the_ids(rag):
    text = f"{CHUNKS[0]} Q: where? A: {CHUNKS[1]}"
    segments = rag.segments(TextPrompt(text))
    assert [s.kind for s in segments] == ["prefix", "suffix"]
    assert [t for s in segments for t in s.token_ids] == rag.tokenizer.encode(text)


@pytest.mark.parametrize("method", ["full_attention", "fusionrag", "cacheblend", "full_reuse"])
def test_every_raw_prompt_runs_again_from_the_prefix_cache_and_r1_equals_full_attention(rag, method):
    for text in [f"{CHUNKS[0]} {CHUNKS[1]} Q: who? A:", "no chunk in here", "x"]:
        full = rag.generate(TextPrompt(text), method="full_attention", max_new_tokens=3)
        again = rag.generate(TextPrompt(text), method="full_attention", max_new_tokens=3)  # served from exact KV
        assert again.token_ids == full.token_ids
        if method != "full_reuse":
            assert rag.generate(TextPrompt(text), method=method, recompute_ratio=1.0, max_new_tokens=3).token_ids == full.token_ids


def test_an_empty_text_prompt_is_refused():
    with pytest.raises(FusionRAGError, match="a text prompt must be a non-empty string"):
        TextPrompt("  ")
