"""Multi-turn reuse: a chat's next turn reads the last turn's KV and computes only its new tokens;
exact requests never read approximated KV; the cache is a bounded tree of token blocks."""

import pytest
import torch

from fusionrag_llm import FusionRAG
from fusionrag_llm.engine.turn_cache import EXACT, TurnCache
from fusionrag_llm.errors import FusionRAGError

CHUNKS = [
    "The lighthouse at Carrow Point was lit for the first time in 1862, after ten years of storms. " * 2,
    "Its keeper, Tomas Vell, kept a log of every ship that passed the point until 1901. " * 2,
]


def _rag(turn_cache_gib: float = 0.25) -> FusionRAG:
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"turn_cache_gib": turn_cache_gib})
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.6, 0.8]], neighbors=1)
    return rag


def _first_turn() -> list[dict]:
    return [{"role": "user", "content": f"Documents:\n{CHUNKS[0]}\n{CHUNKS[1]}\nQuestion: who kept the log?"}]


def _common(a, b) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


@pytest.mark.parametrize("method", ["full_attention", "fusionrag", "cacheblend"])
def test_the_next_turn_computes_only_what_the_last_turn_did_not_feed(method):
    rag = _rag()
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


def test_a_turn_read_from_exact_kv_answers_as_computing_it_all():
    with_cache, without = _rag(), _rag(turn_cache_gib=0)
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


def _kv(n: int, fill: float = 0.0):
    keys = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1).expand(2, 1, n, 4).contiguous() + fill
    return keys, keys + 0.5


def test_lookup_follows_whole_blocks_then_the_matching_start_of_the_next():
    cache = TurnCache(budget_bytes=10**6, block=4)
    ids = list(range(10))  # blocks [0..4) [4..8) [8..10)
    assert cache.remember(ids, *_kv(10), EXACT) == 3
    hit = cache.lookup([0, 1, 2, 3, 4, 5, 99, 7, 8], [EXACT], limit=8)
    assert hit.length == 6 and hit.keys.shape == (2, 1, 6, 4)
    assert hit.keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert cache.lookup(ids, [EXACT], limit=3).length == 3  # never past the limit
    assert cache.lookup(ids, ["plan:other"], limit=9) is None  # another namespace is another tree
    assert cache.lookup([7, 7], [EXACT], limit=2) is None
    assert cache.remember(ids, *_kv(10), EXACT) == 0  # kept once


def test_least_recently_used_blocks_go_first_beyond_the_budget_deepest_first():
    block_bytes = 2 * (2 * 1 * 4 * 4 * 4)  # keys and values of a 4-token block: 2 layers x 1 head x 4 x 4 floats
    cache = TurnCache(budget_bytes=3 * block_bytes, block=4)
    cache.remember(list(range(8)), *_kv(8), EXACT)  # 2 blocks
    cache.lookup(list(range(8)), [EXACT], limit=8)
    cache.remember(list(range(100, 108)), *_kv(8), EXACT)  # 2 more, used later: one block must go
    assert len(cache) == 3 and cache.nbytes == 3 * block_bytes
    assert cache.lookup(list(range(100, 108)), [EXACT], limit=8).length == 8  # the recent path is whole
    assert cache.lookup(list(range(8)), [EXACT], limit=8).length == 4  # the older one lost its deepest block


def test_a_later_turn_hands_over_only_the_kv_after_the_blocks_already_kept():
    cache = TurnCache(budget_bytes=10**6, block=4)
    cache.remember(list(range(10)), *_kv(10), EXACT)  # blocks [0..4) [4..8) and the partial [8..10)
    longer = list(range(14))
    start = cache.kept(longer, EXACT)
    assert start == 8 and cache.kept(longer, "plan:other") == 0  # the partial block is not whole
    keys, values = _kv(14)
    assert cache.remember(longer, keys[:, :, start:], values[:, :, start:], EXACT, start=start) == 2  # [8..12) [12..14)
    hit = cache.lookup(longer, [EXACT], limit=14)
    assert hit.length == 14 and hit.keys[0, 0, :, 0].tolist() == list(range(14))
    torch.testing.assert_close(hit.values, values)


def test_clear_forgets_every_block():
    cache = TurnCache(budget_bytes=10**6, block=4)
    cache.remember(list(range(10)), *_kv(10), EXACT)
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.lookup(list(range(10)), [EXACT], limit=9) is None


def test_blocks_sit_in_one_pool_within_the_budget_on_the_kv_s_device():
    block_bytes = 2 * (2 * 1 * 4 * 4 * 4)
    cache = TurnCache(budget_bytes=5 * block_bytes, block=4)
    assert cache.nbytes == 0 and cache.pool is None  # no memory before the first turn
    cache.remember(list(range(10)), *_kv(10), EXACT)  # 2 whole blocks and a partial one: 3 pool blocks
    assert cache.pool.capacity == 5 and cache.pool.used == 3 and cache.nbytes == 3 * block_bytes
    assert cache.pool.device == torch.device("cpu") and cache.pool.dtype == torch.float32
    with pytest.raises(ValueError, match="does not fit this cache's blocks"):
        cache.remember(list(range(50, 60)), *(kv.double() for kv in _kv(10)), EXACT)
    cache.clear()
    assert cache.pool.used == 0 and len(cache) == 0


def test_dropping_a_block_drops_what_hangs_under_it():
    block_bytes = 2 * (2 * 1 * 4 * 4 * 4)
    cache = TurnCache(budget_bytes=3 * block_bytes, block=4)
    cache.remember(list(range(12)), *_kv(12), EXACT)  # a chain of 3: the pool is full
    cache.remember(list(range(8)) + [70, 71, 72, 73], *_kv(12), EXACT, start=8)  # a branch after 2 blocks
    # the branch's block needed room: the least recently used block no reader holds went (the old
    # chain's last); the shared two blocks stay and both lookups agree with what was kept
    assert len(cache) == 3 and cache.pool.used == 3
    assert cache.lookup(list(range(8)) + [70, 71, 72, 73], [EXACT], limit=12).length == 12
    assert cache.lookup(list(range(12)), [EXACT], limit=12).length == 8


def test_readers_copy_the_kv_that_was_kept_while_other_turns_evict_around_them():
    """Lookups on one thread, turns that keep evicting on another: every hit holds exactly the KV
    kept for its tokens (a block being read is never handed to a new turn mid-copy)."""
    import threading

    block_bytes = 2 * (2 * 1 * 4 * 4 * 4)
    cache = TurnCache(budget_bytes=4 * block_bytes, block=4)
    ids = list(range(8))
    cache.remember(ids, *_kv(8), EXACT)
    errors, stop = [], threading.Event()

    def churn():
        for round_ in range(300):
            other = [1000 + round_ * 8 + i for i in range(8)]
            cache.remember(other, *_kv(8, fill=1000.0 + round_ * 8), EXACT)  # values = token ids
        stop.set()

    def read():
        while not stop.is_set():
            hit = cache.lookup(ids, [EXACT], limit=8)
            if hit is None:
                cache.remember(ids, *_kv(8), EXACT)
                continue
            if hit.keys[0, 0, :, 0].tolist() != [float(i) for i in ids[: hit.length]]:
                errors.append(hit.keys[0, 0, :, 0].tolist())

    threads = [threading.Thread(target=churn), threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and cache.pool.used <= 4
