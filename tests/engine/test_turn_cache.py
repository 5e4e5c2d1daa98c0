"""Multi-turn reuse: a chat's next turn reads the last turn's KV and computes only its new tokens;
exact requests never read approximated KV."""

import os

import pytest
import torch

from fusionrag_llm import FusionRAG
from fusionrag_llm.errors import FusionRAGError

CHUNKS = [
    "The lighthouse at Carrow Point was lit for the first time in 1862, after ten years of storms. " * 2,
    "Its keeper, Tomas Vell, kept a log of every ship that passed the point until 1901. " * 2,
]


def _rag(turn_cache_gib: float = 0.25, codec: str | None = None) -> FusionRAG:
    options = {"turn_cache_gib": turn_cache_gib, **({"kv_codec": codec} if codec else {})}
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options=options)
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.6, 0.8]], neighbors=1)
    return rag


def _first_turn() -> list[dict]:
    return [{"role": "user", "content": f"Documents:\n{CHUNKS[0]}\n{CHUNKS[1]}\nQuestion: who kept the log?"}]


def _common(a, b) -> int:
    return len(os.path.commonprefix([list(a), list(b)]))


@pytest.mark.parametrize("codec", [None, "int8"])  # int8: a store that keeps no exact path blocks
@pytest.mark.parametrize("method", ["full_attention", "fusionrag", "cacheblend"])
def test_the_next_turn_computes_only_what_the_last_turn_did_not_feed(method, codec):
    rag = _rag(codec=codec)
    chat = _first_turn()
    first = rag.generate(chat, method=method, max_new_tokens=8, sampling={"ignore_eos": True})
    fed = (first.prompt_ids + first.token_ids)[:-1]  # the last answer token was never fed back
    chat += [{"role": "assistant", "content": rag.tokenizer.decode(first.token_ids)},
             {"role": "user", "content": "And when was it lit?"}]  # fmt: skip
    second = rag.generate(chat, method=method, max_new_tokens=4)
    shared = _common(fed, second.prompt_ids)
    assert shared > len(first.prompt_ids) // 2  # at least the whole first prompt
    assert second.stats.turn_tokens == shared
    assert second.stats.computed_tokens == second.stats.prompt_tokens - shared  # only the new tokens
    assert second.stats.recomputed_tokens == 0 and second.stats.exact_tokens == shared


@pytest.mark.parametrize("codec", [None, "int8"])
def test_a_turn_read_from_exact_kv_answers_as_computing_it_all(codec):
    with_cache, without = _rag(codec=codec), _rag(turn_cache_gib=0, codec=codec)
    chat = _first_turn()
    for turn in range(3):
        a = with_cache.generate(chat, method="full_attention", max_new_tokens=6)
        b = without.generate(chat, method="full_attention", max_new_tokens=6)
        assert a.token_ids == b.token_ids and b.stats.turn_tokens == 0
        assert turn == 0 or a.stats.turn_tokens > 0
        logits_a = with_cache.logits(chat, a.token_ids[:3], method="full_attention")
        logits_b = without.logits(chat, a.token_ids[:3], method="full_attention")
        torch.testing.assert_close(logits_a, logits_b, rtol=1e-4, atol=1e-4)  # rotary undone and redone
        chat = chat + [{"role": "assistant", "content": "It was Tomas Vell."}, {"role": "user", "content": f"Why {turn}?"}]


def test_exact_requests_never_read_approximated_kv():
    rag = _rag()
    chat = _first_turn()
    rag.generate(chat, method="fusionrag", max_new_tokens=6, sampling={"ignore_eos": True})  # approximated: its own namespace
    again = rag.generate(chat, method="fusionrag", max_new_tokens=6)
    assert again.stats.turn_tokens == again.stats.prompt_tokens - 1  # the same settings read it
    exact = rag.generate(chat, method="full_attention", max_new_tokens=6)
    assert exact.stats.turn_tokens == 0  # Full Attention does not
    assert rag.generate(chat, method="fusionrag", recompute_ratio=1.0, max_new_tokens=6).stats.turn_tokens > 0
    other = rag.generate(chat, method="fusionrag", recompute_ratio=0.3, max_new_tokens=6)
    assert other.stats.turn_tokens == exact.stats.prompt_tokens - 1  # the exact KV Full Attention left


def test_the_turn_cache_is_off_by_default_and_checks_its_budget():
    assert FusionRAG.from_pretrained("tiny", store=":memory:").engine.kv.turns is None
    for bad in (-1, "2", True, 4096):
        with pytest.raises(FusionRAGError, match=r"turn_cache_gib must be a number of GiB in \[0, 1024\)"):
            FusionRAG.from_pretrained("tiny", store=":memory:", options={"turn_cache_gib": bad})
