"""Attention of a step's queries over a request's KV cache.

The general case applies the cache's position mask. Three common shapes go faster on CPU, with the
same result:

* one query that sees every used slot (a decode step): the query heads of each key/value head
  attend as a group, without a mask or repeated keys;
* a contiguous causal block at the end of the cache (a prefill after a cached prefix, a fused
  chunk after its neighbours);
* position-sorted queries over a cache whose slot j holds position j (the sparse prefill of a
  request).

In the last two every query sees a prefix of the slots, so one call of the compiled prefill kernel
(``kernels/cpu_attention.py``) attends them all. Where it does not run (no compiler, no AVX-512, other
dtypes or head sizes), PyTorch's fused kernel does: for a causal block, full attention over the earlier
slots plus causal attention within the block, merged by their log-sum-exp, without a materialised
mask; for sorted queries, blocks of queries that skip the keys after their last position.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from fusionrag_llm.kernels.cpu_attention import attend_prefix_cpu

_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def causal_tail_start(slots: torch.Tensor, positions: torch.Tensor, cache_positions: torch.Tensor,
                      cache_valid: torch.Tensor, length: int, any_device: bool = False) -> int | None:  # fmt: skip
    """First slot of the step if its tokens are a causal block ending the cache, else None. Only on
    the CPU (where the answer costs no device sync) unless ``any_device``."""
    n = len(slots)
    start = length - n
    if n == 0 or (not any_device and (slots.device.type != "cpu" or _FLASH_CPU is None)):
        return None
    block = torch.arange(start, length, device=slots.device)
    if not torch.equal(slots, block) or not torch.equal(positions, positions[0] + block - start):
        return None
    if start and not (bool(cache_valid[:start].all()) and int(cache_positions[:start].max()) < int(positions[0])):
        return None
    return start


def dense_sorted(positions: torch.Tensor, cache_positions: torch.Tensor, cache_valid: torch.Tensor,
                 length: int) -> bool:  # fmt: skip
    """True when every used slot is valid and holds its own position, and the queries are sorted:
    then a query at p sees exactly the slots [0, p] (the sparse prefill of a request cache)."""
    if positions.device.type != "cpu" or len(positions) == 0:
        return False
    if len(positions) > 1 and not bool((positions[1:] >= positions[:-1]).all()):
        return False
    return bool(cache_valid[:length].all()) and torch.equal(cache_positions[:length], torch.arange(length))


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
           tail_start: int | None, sorted_queries: SortedQueries | None = None) -> torch.Tensor:  # fmt: skip
    """q [heads, n, d] over keys/values [kv_heads, length, d] -> [heads, n, d]."""
    if tail_start is not None and q.shape[1] == 1:
        return attend_one(q, keys, values)
    if sorted_queries is not None:
        out = attend_prefix_cpu(q, keys, values, sorted_queries.limits)
        return out if out is not None else _attend_sorted(q[None], keys[None], values[None], sorted_queries)[0]
    if tail_start is None:
        return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True)[0]
    out = attend_prefix_cpu(q, keys, values, torch.arange(tail_start + 1, tail_start + q.shape[1] + 1))
    if out is not None:  # query i of the block sees the slots up to its own
        return out
    groups = q.shape[0] // keys.shape[0]
    keys, values = keys.repeat_interleave(groups, 0)[None], values.repeat_interleave(groups, 0)[None]
    own, own_lse = _FLASH_CPU(q[None], keys[:, :, tail_start:], values[:, :, tail_start:], is_causal=True)[:2]
    if tail_start == 0:
        return own[0]
    seen, seen_lse = _FLASH_CPU(q[None], keys[:, :, :tail_start], values[:, :, :tail_start])[:2]
    return _merge(own, own_lse, seen, seen_lse)[0].to(q.dtype)


def attend_causal_block(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tail_start: int) -> torch.Tensor:
    """q [heads, n, d], the causal block ending the cache at slots ``[tail_start, length)``, over keys
    and values [kv_heads, length, d] -> [heads, n, d], through PyTorch's fused attention: flash with
    a plain causal mask when the block is the whole cache, else the lower-right causal bias (each
    query also sees every slot before the block). Where the flash kernel takes grouped-query heads
    (CUDA, half precision) it reads each key/value head for its group of query heads; elsewhere the
    keys are repeated per query head, which every fused kernel takes (a copy of the whole cache per
    layer: ~0.5 GB at 32k tokens of Llama-3-8B in bf16)."""
    q, keys, values = q[None], keys[None], values[None]
    grouped = q.shape[1] != keys.shape[1]
    if grouped and not flash_takes_groups(q, keys):
        group = q.shape[1] // keys.shape[1]
        keys, values, grouped = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1), False
    if tail_start == 0:
        return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=grouped)[0]
    from torch.nn.attention.bias import causal_lower_right  # imports torch's compiler stack (~1.4 s): not at start-up

    bias = causal_lower_right(q.shape[2], keys.shape[2])
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, enable_gqa=grouped)[0]


def flash_takes_groups(q: torch.Tensor, keys: torch.Tensor) -> bool:
    """Whether PyTorch's flash kernel attends q [1, heads, n, d] over keys [1, kv_heads, length, d]
    (fewer heads) as they are: on CUDA, in half precision, where this torch's flash kernel is built.
    Anywhere else a grouped call would fall back to a kernel that materialises the scores."""
    if q.device.type != "cuda":
        return False
    return _flash_groups(q.device, q.dtype, q.shape[1], keys.shape[1], q.shape[-1])


@functools.cache
def _flash_groups(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, dim: int) -> bool:
    """``flash_takes_groups`` for one shape of heads (asked once: every layer of every step asks it); False
    where this torch cannot say (then the keys are repeated, as every fused kernel takes them)."""
    try:
        from torch.backends.cuda import SDPAParams, can_use_flash_attention

        q = torch.empty(1, heads, 2, dim, dtype=dtype, device=device)
        keys = torch.empty(1, kv_heads, 2, dim, dtype=dtype, device=device)
        return bool(can_use_flash_attention(SDPAParams(q, keys, keys, None, 0.0, False, True), False))
    except (ImportError, TypeError, RuntimeError):
        return False


def attend_one(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One query that sees every key (a decode step): q [heads, 1, d] -> [heads, 1, d].

    The heads sharing a key/value head become that head's rows, so grouped-query attention needs
    neither a mask nor a copy of the keys per query head."""
    heads, _, dim = q.shape
    grouped = q.reshape(keys.shape[0], heads // keys.shape[0], dim)  # [kv_heads, group, d]
    out = F.scaled_dot_product_attention(grouped[None], keys[None], values[None])[0]
    return out.reshape(heads, 1, dim)


def _merge(a: torch.Tensor, a_lse: torch.Tensor, b: torch.Tensor, b_lse: torch.Tensor) -> torch.Tensor:
    """Softmax attention over two disjoint key sets, from each part's output and log-sum-exp."""
    top = torch.maximum(a_lse, b_lse)
    w_a, w_b = (a_lse - top).exp()[..., None], (b_lse - top).exp()[..., None]
    return (a * w_a + b * w_b) / (w_a + w_b)


def attend_scaled(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                  scaled: torch.Tensor, temperature: float, scale: float) -> torch.Tensor:  # fmt: skip
    """APE's attention: q [heads, n, d] over keys/values [kv_heads, length, d] where ``mask`` [n, length]
    allows. The ``scaled`` [length] keys form one group: inside it, weights are a softmax of the logits
    divided by ``temperature``; the group as a whole counts as one key whose log-weight is
    ``temperature * logsumexp(logits / temperature) + log(scale)`` next to the other keys. So T = S = 1
    is plain attention. Computed in float32."""
    groups = q.shape[0] // keys.shape[0]
    keys, values = keys.float().repeat_interleave(groups, 0), values.float().repeat_interleave(groups, 0)
    logits = (q.float() @ keys.transpose(1, 2) / q.shape[-1] ** 0.5).masked_fill(~mask, float("-inf"))
    sharp = (logits / temperature).masked_fill(~scaled, float("-inf"))
    group = sharp.logsumexp(dim=-1, keepdim=True)  # [heads, n, 1]; -inf where no scaled key is visible
    shift = torch.where(group.isfinite(), (temperature - 1.0) * group, torch.zeros_like(group)) + math.log(scale)
    weights = torch.softmax(torch.where(scaled, sharp + shift, logits), dim=-1)
    return (weights @ values).to(q.dtype)


SORTED_BLOCK = 128  # queries per block (measured: 64 and 256 were slower at 6k tokens, 13% recomputed)


class SortedQueries:
    """Queries at sorted ``positions`` over a cache whose slot j holds position j (the sparse prefill of a
    request), cut into blocks of ``SORTED_BLOCK``: each block's rows, the keys before its first position
    (seen by all of it) and the mask of the keys between its first and last position. Every layer of a
    forward attends the same blocks, so each block's mask is made at the first layer only (about 4% of
    a layer's attention at 6k tokens, 13% recomputed). The blocks serve PyTorch's kernel; where the
    compiled one runs, it takes all the queries at once by their ``limits``."""

    def __init__(self, positions: torch.Tensor) -> None:
        self.positions = positions
        self.limits = (positions + 1).to(torch.int64)  # query i sees slots [0, limits[i]) (the compiled kernel)
        self._blocks: tuple[tuple, list] | None = None  # ((group, dtype), blocks) of the last layer asked

    def blocks(self, group: int, dtype: torch.dtype) -> list[tuple[int, int, int, int, torch.Tensor]]:
        """(first row, rows, low, high, bias) per block: its queries see every key before ``low``, and
        keys ``[low, high)`` through ``bias`` [1, 1, group * rows, high - low] (0 or -inf), the rows of
        the ``group`` query heads of a key/value head stacked."""
        key = (group, dtype)
        if self._blocks is None or self._blocks[0] != key:
            made = []
            for start in range(0, len(self.positions), SORTED_BLOCK):
                where = self.positions[start : start + SORTED_BLOCK]
                low, high = int(where[0]), int(where[-1]) + 1
                hidden = (torch.arange(low, high)[None, :] > where[:, None]).repeat(group, 1)
                bias = torch.zeros(hidden.shape, dtype=dtype).masked_fill_(hidden, float("-inf"))[None, None]
                made.append((start, len(where), low, high, bias))
            self._blocks = (key, made)
        return self._blocks[1]


def _attend_sorted(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, queries: SortedQueries) -> torch.Tensor:
    """q [1, heads, n, d] at ``queries``' sorted positions over keys [1, kv_heads, L, d] where slot j is position j.

    Each block of queries skips the keys after its last position. Of the keys it reads, those before
    its first position are seen by every query of the block: they go through the fused kernel
    without a mask, and only the span between its first and last position takes a mask; the two
    parts are merged by their log-sum-exp. The query heads that share a key/value head are stacked
    as rows of that head, so the keys are not repeated. About half the work of one masked call over
    every key when the recompute set is spread over the context, and a quarter less than masking
    every block whole."""
    if not _flash_takes_masks():
        return _attend_sorted_masked(q, keys, values, queries.positions)
    _, heads, n, dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    outputs = []
    for start, rows, low, high, bias in queries.blocks(group, q.dtype):
        block = q[:, :, start : start + rows].reshape(1, kv_heads, group * rows, dim)
        out, lse = _FLASH_CPU(block, keys[:, :, low:high], values[:, :, low:high], attn_mask=bias)[:2]
        if low > 0:  # every query of the block sees keys [0, low): no mask there
            seen, seen_lse = _FLASH_CPU(block, keys[:, :, :low], values[:, :, :low])[:2]
            out = _merge(out, lse, seen, seen_lse).to(q.dtype)
        outputs.append(out.reshape(1, heads, rows, dim))
    return torch.cat(outputs, dim=2)


def _attend_sorted_masked(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``_attend_sorted`` for a torch whose CPU flash kernel takes no mask: each block masked whole."""
    outputs = []
    for start in range(0, q.shape[2], SORTED_BLOCK):
        where = positions[start : start + SORTED_BLOCK]
        high = int(where[-1]) + 1
        visible = (torch.arange(high)[None, :] <= where[:, None])[None, None]
        outputs.append(F.scaled_dot_product_attention(q[:, :, start : start + SORTED_BLOCK], keys[:, :, :high],
                                                      values[:, :, :high], attn_mask=visible, enable_gqa=True))  # fmt: skip
    return torch.cat(outputs, dim=2)


@functools.cache
def _flash_takes_masks() -> bool:
    """Whether this torch's CPU flash kernel takes ``attn_mask`` (and returns the log-sum-exp)."""
    if _FLASH_CPU is None:
        return False
    try:
        x = torch.zeros(1, 1, 2, 4)
        _FLASH_CPU(x, x, x, attn_mask=torch.zeros(1, 1, 2, 2))
    except (TypeError, RuntimeError):
        return False
    return True
