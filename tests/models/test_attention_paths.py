"""The CPU attention fast paths (``models/attention.py``) against a float64 masked softmax: the
sparse prefill's sorted blocks (each split into an unmasked part and a masked span), their
whole-block masked fallback, the causal tail block and the single decode query. Head size 32: the
compiled prefill kernel takes multiples of 64, so these run PyTorch's kernels, the paths where it does
not run (``tests/kernels/test_cpu_attention.py`` checks the kernel and ``attend`` through it)."""

import pytest
import torch

from fusionrag_llm.models import attention

TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 2e-2}


def oracle(q, keys, values, query_positions):
    """float64 softmax attention of q [heads, n, d] at ``query_positions`` over keys at 0..L-1."""
    group = q.shape[0] // keys.shape[0]
    k, v = keys.double().repeat_interleave(group, 0), values.double().repeat_interleave(group, 0)
    scores = q.double() @ k.transpose(1, 2) / q.shape[-1] ** 0.5
    visible = torch.arange(keys.shape[1])[None, :] <= query_positions[:, None]
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v


def inputs(length, count, heads, kv_heads, dtype, seed, first=None):
    g = torch.Generator().manual_seed(seed)
    positions = torch.randperm(length, generator=g)[:count].sort().values
    if first is not None:
        positions[0] = first
        positions = positions.unique()
    q = torch.randn(heads, len(positions), 32, generator=g).to(dtype)
    keys = torch.randn(kv_heads, length, 32, generator=g).to(dtype)
    values = torch.randn(kv_heads, length, 32, generator=g).to(dtype)
    return q, keys, values, positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("length", "count", "heads", "kv_heads", "first"), [
    (2000, 300, 6, 2, None),  # several blocks, grouped-query heads
    (700, 700, 4, 4, None),  # every position: the first block starts at 0 (no unmasked part)
    (500, 129, 3, 1, 0),  # a query at position 0; one block plus one row
    (90, 5, 2, 1, 89),  # a few queries, the last one at the last key
])  # fmt: skip
def test_sorted_blocks_equal_a_masked_softmax(dtype, length, count, heads, kv_heads, first):
    q, keys, values, positions = inputs(length, count, heads, kv_heads, dtype, length + count, first)
    expected = oracle(q, keys, values, positions)
    fast = attention.attend(q, keys, values, None, None, attention.SortedQueries(positions))
    masked = attention._attend_sorted_masked(q[None], keys[None], values[None], positions)[0]
    assert fast.dtype == dtype and fast.shape == q.shape
    assert (fast.double() - expected).abs().max().item() < TOLERANCE[dtype]
    assert (masked.double() - expected).abs().max().item() < TOLERANCE[dtype]


def test_one_forwards_sorted_blocks_serve_every_layer_and_each_head_grouping():
    """A forward makes one ``SortedQueries`` and every layer attends through it (its masks made once)."""
    q, keys, values, positions = inputs(2000, 300, 6, 2, torch.float32, 5)
    queries = attention.SortedQueries(positions)
    for layer in range(3):  # other keys and values in every layer, the same positions
        keys, values = keys.roll(layer, dims=1), values.roll(2 * layer, dims=1)
        out = attention.attend(q, keys, values, None, None, queries)
        assert (out.double() - oracle(q, keys, values, positions)).abs().max().item() < TOLERANCE[torch.float32]
    for heads, kv_heads, dtype in ((6, 3, torch.float32), (6, 2, torch.bfloat16)):  # another grouping, another dtype
        q, keys, values, _ = inputs(2000, 300, heads, kv_heads, dtype, 6)
        q = torch.randn(heads, len(positions), 32).to(dtype)
        out = attention.attend(q, keys, values, None, None, queries)
        assert out.dtype == dtype and (out.double() - oracle(q, keys, values, positions)).abs().max().item() < TOLERANCE[dtype]


def test_sorted_blocks_use_the_unmasked_kernel_where_this_torch_has_it():
    assert attention._flash_takes_masks() == (attention._FLASH_CPU is not None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_causal_tail_block_and_a_decode_query_equal_a_masked_softmax(dtype):
    q, keys, values, _ = inputs(300, 1, 6, 2, dtype, 7)
    q = torch.randn(6, 40, 32).to(dtype)
    positions = torch.arange(260, 300)
    tail = attention.attend(q, keys, values, None, 260)
    assert (tail.double() - oracle(q, keys, values, positions)).abs().max().item() < TOLERANCE[dtype]
    one = attention.attend(q[:, -1:], keys, values, None, 299)
    assert (one.double() - oracle(q[:, -1:], keys, values, positions[-1:])).abs().max().item() < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tail_start", "kv_heads"), [(0, 2), (260, 2), (260, 6)])
def test_the_fused_causal_block_of_the_triton_backend_equals_a_masked_softmax(dtype, tail_start, kv_heads):
    """``attend_causal_block`` (prefill blocks on the Triton backend, through PyTorch's fused kernels)."""
    _, keys, values, _ = inputs(300, 1, 6, kv_heads, dtype, 11)
    q = torch.randn(6, 300 - tail_start, 32).to(dtype)
    out = attention.attend_causal_block(q, keys, values, tail_start)
    expected = oracle(q, keys, values, torch.arange(tail_start, 300))
    assert out.shape == q.shape and (out.double() - expected).abs().max().item() < TOLERANCE[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("tail_start", [0, 260])
def test_the_fused_causal_block_reads_grouped_heads_as_they_are_on_cuda_in_half_precision(tail_start):
    """On CUDA in bf16 the flash kernel takes the key/value heads unrepeated; float32 still repeats them."""
    _, keys, values, _ = inputs(300, 1, 6, 2, torch.bfloat16, 13)
    q = torch.randn(6, 300 - tail_start, 32).to(torch.bfloat16)
    expected = oracle(q, keys, values, torch.arange(tail_start, 300))
    q, keys, values = q.cuda(), keys.cuda(), values.cuda()
    assert attention.flash_takes_groups(q[None], keys[None])
    assert not attention.flash_takes_groups(q[None].float(), keys[None].float())
    out = attention.attend_causal_block(q, keys, values, tail_start)
    assert out.shape == q.shape and (out.double().cpu() - expected).abs().max().item() < TOLERANCE[torch.bfloat16]
