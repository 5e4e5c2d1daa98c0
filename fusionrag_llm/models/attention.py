"""Attention of a step's queries over a request's KV cache.

The general case applies the cache's position mask. A step whose tokens are a contiguous causal
block at the end of the cache (a prefill after a cached prefix, a fused chunk after its
neighbours, a decode step) is split instead: full attention over the earlier slots plus causal
attention within the block, merged by their log-sum-exp. On CPU that uses the fused kernel without
a materialised mask and takes about half the time of the masked call, with the same result.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def causal_tail_start(slots: torch.Tensor, positions: torch.Tensor, cache_positions: torch.Tensor,
                      cache_valid: torch.Tensor, length: int) -> int | None:  # fmt: skip
    """First slot of the step if its tokens are a causal block ending the cache, else None."""
    n = len(slots)
    start = length - n
    if n == 0 or slots.device.type != "cpu" or _FLASH_CPU is None:
        return None
    block = torch.arange(start, length)
    if not torch.equal(slots, block) or not torch.equal(positions, positions[0] + block - start):
        return None
    if start and not (bool(cache_valid[:start].all()) and int(cache_positions[:start].max()) < int(positions[0])):
        return None
    return start


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
           tail_start: int | None) -> torch.Tensor:  # fmt: skip
    """q [heads, n, d] over keys/values [kv_heads, length, d] -> [heads, n, d]."""
    if tail_start is None:
        return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True)[0]
    groups = q.shape[0] // keys.shape[0]
    keys, values = keys.repeat_interleave(groups, 0)[None], values.repeat_interleave(groups, 0)[None]
    own, own_lse = _FLASH_CPU(q[None], keys[:, :, tail_start:], values[:, :, tail_start:], is_causal=True)[:2]
    if tail_start == 0:
        return own[0]
    seen, seen_lse = _FLASH_CPU(q[None], keys[:, :, :tail_start], values[:, :, :tail_start])[:2]
    top = torch.maximum(own_lse, seen_lse)
    w_own, w_seen = (own_lse - top).exp()[..., None], (seen_lse - top).exp()[..., None]
    return ((own * w_own + seen * w_seen) / (w_own + w_seen))[0].to(q.dtype)
