"""The prefix cache: a bounded tree of token blocks in a block pool, found through integer hash-chain
keys; readers hold their blocks while they copy."""

import pytest
import torch

from fusionrag_llm.models.prefix_cache import EXACT, PrefixCache


def _kv(n: int, fill: float = 0.0):
    keys = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1).expand(2, 1, n, 4).contiguous() + fill
    return keys, keys + 0.5


def test_lookup_follows_whole_blocks_then_the_matching_start_of_the_next():
    cache = PrefixCache(budget_bytes=10**6, block=4)
    ids = list(range(10))  # blocks [0..4) [4..8) [8..10)
    assert cache.remember(ids, *_kv(10), EXACT) == 3
    hit = cache.lookup([0, 1, 2, 3, 4, 5, 99, 7, 8], [EXACT], limit=8)
    assert hit.length == 6 and hit.keys.shape == (2, 1, 6, 4)
    assert hit.keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert cache.lookup(ids, [EXACT], limit=3).length == 3  # never past the limit
    assert cache.lookup(ids, [EXACT], limit=9, beyond=9) is None and cache.lookup(ids, [EXACT], 9, beyond=8).length == 9
    assert cache.lookup(ids, ["plan:other"], limit=9) is None  # another namespace is another tree
    assert cache.lookup([7, 7], [EXACT], limit=2) is None
    assert cache.remember(ids, *_kv(10), EXACT) == 0  # kept once


def test_least_recently_used_blocks_go_first_beyond_the_budget_deepest_first():
    block_bytes = 2 * (2 * 1 * 4 * 4 * 4)  # keys and values of a 4-token block: 2 layers x 1 head x 4 x 4 floats
    cache = PrefixCache(budget_bytes=3 * block_bytes, block=4)
    cache.remember(list(range(8)), *_kv(8), EXACT)  # 2 blocks
    cache.lookup(list(range(8)), [EXACT], limit=8)
    cache.remember(list(range(100, 108)), *_kv(8), EXACT)  # 2 more, used later: one block must go
    assert len(cache) == 3 and cache.nbytes == 3 * block_bytes
    assert cache.lookup(list(range(100, 108)), [EXACT], limit=8).length == 8  # the recent path is whole
    assert cache.lookup(list(range(8)), [EXACT], limit=8).length == 4  # the older one lost its deepest block


def test_a_later_turn_hands_over_only_the_kv_after_the_blocks_already_kept():
    cache = PrefixCache(budget_bytes=10**6, block=4)
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
    cache = PrefixCache(budget_bytes=10**6, block=4)
    cache.remember(list(range(10)), *_kv(10), EXACT)
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.lookup(list(range(10)), [EXACT], limit=9) is None


def test_blocks_sit_in_one_pool_within_the_budget_on_the_kv_s_device():
    block_bytes = 2 * (2 * 1 * 4 * 4 * 4)
    cache = PrefixCache(budget_bytes=5 * block_bytes, block=4)
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
    cache = PrefixCache(budget_bytes=3 * block_bytes, block=4)
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
    cache = PrefixCache(budget_bytes=4 * block_bytes, block=4)
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
