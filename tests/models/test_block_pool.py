"""The KV block pool: fixed-size blocks with reference counts within a byte budget."""

import pytest
import torch

from fusionrag_llm.models.block_pool import BlockPool


def _pool(blocks: int) -> BlockPool:
    one = 2 * 2 * 1 * 4 * 8 * 4  # keys and values: 2 layers x 1 head x 4 tokens x 8 dims x 4 bytes
    return BlockPool(2, 1, 4, 8, torch.float32, "cpu", budget_bytes=blocks * one + one // 2)


def test_blocks_are_handed_out_until_the_budget_then_come_back_when_unreferenced():
    pool = _pool(3)
    assert pool.capacity == 3 and pool.used == 0
    blocks = [pool.allocate() for _ in range(3)]
    assert sorted(blocks) == [0, 1, 2] and pool.allocate() is None and pool.used == 3
    pool.ref([blocks[0]])  # a second holder
    pool.unref([blocks[0]])
    assert pool.used == 3 and pool.refs(blocks[0]) == 1  # still held once
    pool.unref([blocks[0]])
    assert pool.used == 2 and pool.allocate() == blocks[0]


def test_a_block_s_views_are_its_own_memory():
    pool = _pool(2)
    a, b = pool.allocate(), pool.allocate()
    pool.kv(a)[0].fill_(1.0)
    pool.kv(b)[0].fill_(2.0)
    pool.kv(a)[1].fill_(3.0)
    assert pool.kv(a)[0].shape == (2, 1, 4, 8)
    assert pool.kv(a)[0].unique().tolist() == [1.0] and pool.kv(b)[0].unique().tolist() == [2.0]
    assert pool.kv(a)[1].unique().tolist() == [3.0]


def test_references_are_checked():
    pool = _pool(1)
    block = pool.allocate()
    pool.unref([block])
    with pytest.raises(ValueError, match="free already"):
        pool.unref([block])
    with pytest.raises(ValueError, match="only a holder can share"):
        pool.ref([block])


def test_an_empty_budget_holds_no_block():
    assert _pool(0).allocate() is None


def test_a_device_without_the_memory_leaves_the_pool_full_not_failing():
    pool = BlockPool(1, 1, 1 << 20, 1 << 20, torch.float32, "cpu", budget_bytes=1 << 62)  # 8 TiB blocks
    assert pool.allocate() is None and pool.capacity == 0
