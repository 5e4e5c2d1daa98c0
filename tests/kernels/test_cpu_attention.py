"""The compiled prefill attention (``kernels/cpu_attention.py``) against a float64 softmax: every query
over a prefix of the keys, grouped-query heads, head sizes 64-256, views into larger caches, queries that
see nothing; each row's numbers independent of the rows and threads beside it; what it declines. Then
``models/attention.attend``'s causal-block and sorted-query paths through it."""

import pytest
import torch

from compiled_kernels import needs_prefill_kernel

from fusionrag_llm.kernels.cpu_attention import attend_prefix_cpu
from fusionrag_llm.models import attention


def oracle(q, keys, values, limits):
    """float64 softmax attention of q [heads, n, d] over keys [kv_heads, L, d], query i seeing keys < limits[i]."""
    group = q.shape[0] // keys.shape[0]
    k, v = keys.double().repeat_interleave(group, 0), values.double().repeat_interleave(group, 0)
    scores = q.double() @ k.transpose(1, 2) / q.shape[-1] ** 0.5
    visible = torch.arange(keys.shape[1])[None, :] < limits[:, None]
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0)
    return weights @ v


def case(heads, kv_heads, d, n, length, seed, capacity=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, n + 5, d, generator=g)[:, 2 : n + 2]  # a view, as a forward's slice of its rows
    cap = capacity or length
    keys = torch.randn(kv_heads, cap, d, generator=g)[:, :length]  # the used slots of a larger cache
    values = torch.randn(kv_heads, cap, d, generator=g)[:, :length]
    return q, keys, values


@needs_prefill_kernel
@pytest.mark.parametrize(("heads", "kv_heads", "d", "n", "length"), [
    (9, 3, 64, 130, 1000),  # SmolLM2's heads, sorted limits over many chunks
    (4, 4, 64, 64, 64),  # no grouping, a causal block that is the whole cache
    (8, 2, 128, 37, 300),  # Llama-like head size
    (4, 1, 256, 5, 70),  # the largest head size taken
    (6, 2, 64, 1, 129),  # one query
])  # fmt: skip
def test_every_query_over_its_prefix_equals_a_float64_softmax(heads, kv_heads, d, n, length):
    q, keys, values = case(heads, kv_heads, d, n, length, seed=n + d, capacity=length + 50)
    g = torch.Generator().manual_seed(length)
    sorted_limits = torch.randint(1, length + 1, (n,), generator=g).sort().values
    causal = torch.arange(length - n + 1, length + 1)
    scattered = torch.randint(0, length + 1, (n,), generator=g)  # any order, some seeing nothing
    for limits in (sorted_limits, causal, scattered):
        got = attend_prefix_cpu(q, keys, values, limits)
        assert got.shape == q.shape
        torch.testing.assert_close(got.double(), oracle(q, keys, values, limits), rtol=0, atol=2e-6)
    assert torch.all(attend_prefix_cpu(q, keys, values, torch.zeros(n, dtype=torch.int64)) == 0)


@needs_prefill_kernel
def test_a_rows_numbers_do_not_depend_on_the_rows_or_threads_beside_it():
    """What makes a chunk's entry the same bits in every process, and a causal block the same whether it
    is a whole prompt's prefill or an entry's computation."""
    q, keys, values = case(9, 3, 64, 50, 400, seed=1)
    limits = torch.arange(351, 401)
    together = attend_prefix_cpu(q, keys, values, limits)
    alone = torch.cat([attend_prefix_cpu(q[:, i : i + 1], keys, values, limits[i : i + 1]) for i in range(50)], dim=1)
    assert torch.equal(together, alone)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(attend_prefix_cpu(q, keys, values, limits), together)
    finally:
        torch.set_num_threads(threads)


def test_what_it_does_not_take_goes_back_to_torch_and_bad_limits_are_refused():
    q, keys, values = case(4, 2, 64, 3, 10, seed=2)
    limits = torch.tensor([1, 5, 10])
    assert attend_prefix_cpu(q.bfloat16(), keys.bfloat16(), values.bfloat16(), limits) is None
    q80, k80, v80 = case(4, 2, 80, 3, 10, seed=2)
    assert attend_prefix_cpu(q80, k80, v80, limits) is None  # head size not a multiple of 64
    assert attend_prefix_cpu(q, keys.transpose(1, 2).contiguous().transpose(1, 2), values, limits) is None
    with pytest.raises(ValueError, match="outside"):
        attend_prefix_cpu(q, keys, values, torch.tensor([1, 5, 11]))
    with pytest.raises(ValueError, match="int64"):
        attend_prefix_cpu(q, keys, values, limits.int())


@needs_prefill_kernel
def test_attend_takes_causal_blocks_and_sorted_queries_through_it(monkeypatch):
    heads, kv_heads, d, length = 9, 3, 64, 700
    q, keys, values = case(heads, kv_heads, d, 120, length, seed=3)
    calls = []
    real = attention.attend_prefix_cpu

    def counted(*args):
        calls.append(args[3])
        return real(*args)

    monkeypatch.setattr(attention, "attend_prefix_cpu", counted)
    tail = attention.attend(q, keys, values, None, length - 120)  # the last 120 slots, causal
    torch.testing.assert_close(tail.double(), oracle(q, keys, values, torch.arange(581, 701)), rtol=0, atol=2e-6)
    positions = torch.randperm(length, generator=torch.Generator().manual_seed(4))[:120].sort().values
    sparse = attention.attend(q, keys, values, None, None, attention.SortedQueries(positions))
    torch.testing.assert_close(sparse.double(), oracle(q, keys, values, positions + 1), rtol=0, atol=2e-6)
    assert len(calls) == 2 and torch.equal(calls[1], positions + 1)
