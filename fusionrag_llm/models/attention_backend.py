"""Attention backends, chosen once when a model is loaded.

A backend prepares per-sequence metadata once per forward (``prepare``) and attends one layer of one
sequence over its cache (``__call__``). ``torch`` picks the fastest exact CPU path for the shape of
the step (see ``models/attention.py``); ``triton`` runs the query-sparse attention kernel, and the
masked torch path where a step uses attention groups (batched plain-entry computation), which the
kernel does not model. A step with ``scaling`` (APE) takes the rescaled softmax on either backend.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch

from fusionrag_llm.kernels import dispatch
from fusionrag_llm.models.attention import attend, attend_causal_block, attend_scaled, causal_tail_start, dense_sorted
from fusionrag_llm.models.kv_cache import KVCache

BACKEND_NAMES = ("torch", "triton")


@dataclass
class AttentionMeta:
    mask: torch.Tensor | None = None  # [1, 1, n, length] position (and group) mask, when no fast path applies
    tail_start: int | None = None  # the step is a causal block ending the cache, from this slot
    sorted_positions: torch.Tensor | None = None  # sorted queries over a cache where slot j is position j
    # one query over the cache's used slots (Triton): [0, 1, 0, length] on the device, the kernel's query
    # and key offsets, so neither the call nor its shapes depend on the length (no sync, graph-capturable)
    offsets: torch.Tensor | None = None
    block_mask: object = None  # FlexAttention's block mask of a recompute step (TritonAttention.recompute)


def one_query_offsets(lengths: list[int], device: torch.device) -> torch.Tensor:
    """[n, 4] int64 rows ``[0, 1, 0, length]`` on ``device`` in one copy that does not wait for the device."""
    host = torch.tensor([[0, 1, 0, n] for n in lengths], dtype=torch.int64)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _masked(step, cache: KVCache) -> AttentionMeta:
    return AttentionMeta(mask=cache.attention_mask(step.positions, step.groups)[None, None])


def _scaled(q: torch.Tensor, cache: KVCache, layer: int, step, meta: AttentionMeta) -> torch.Tensor:
    """A step with ``scaling`` (APE) takes the rescaled softmax, whatever the backend."""
    n, scaling = cache.length, step.scaling
    return attend_scaled(q, cache.keys[layer, :, :n], cache.values[layer, :, :n], meta.mask[0, 0],
                         scaling.slots[:n], scaling.temperature, scaling.scale)  # fmt: skip


class _Backend:
    def prepare(self, step, cache: KVCache) -> AttentionMeta | None:
        raise NotImplementedError

    def prepare_all(self, steps, caches, offsets: torch.Tensor | None = None) -> list[AttentionMeta | None]:
        """Every sequence's ``prepare``; ``offsets``: see ``TritonAttention.prepare_all``."""
        return [self.prepare(step, cache) for step, cache in zip(steps, caches)]


class TorchAttention(_Backend):
    name = "torch"

    def prepare(self, step, cache: KVCache) -> AttentionMeta:
        if step.groups is not None or step.scaling is not None:
            return _masked(step, cache)
        tail = causal_tail_start(step.slots, step.positions, cache.positions, cache.valid, cache.length)
        if tail is not None:
            return AttentionMeta(tail_start=tail)
        if dense_sorted(step.positions, cache.positions, cache.valid, cache.length):
            return AttentionMeta(sorted_positions=step.positions)
        return _masked(step, cache)

    def __call__(self, q: torch.Tensor, cache: KVCache, layer: int, step, meta: AttentionMeta) -> torch.Tensor:
        if step.scaling is not None:
            return _scaled(q, cache, layer, step, meta)
        n = cache.length
        return attend(q, cache.keys[layer, :, :n], cache.values[layer, :, :n], meta.mask, meta.tail_start,
                      meta.sorted_positions)  # fmt: skip


class TritonAttention(_Backend):
    """``recompute``: what attends a step's scattered queries over the cache (a sparse recompute),
    "kernel" (the own query-sparse kernel) or "flex" (FlexAttention, compiled on CUDA, with one block
    mask per forward from the positions). ``fusionrag bench gpu --sections attention`` times both, in
    isolation and as time to the first token; the faster one on the cards measured becomes the default."""

    name = "triton"
    RECOMPUTE = ("kernel", "flex")

    def __init__(self, recompute: str = "kernel") -> None:
        if recompute not in self.RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(self.RECOMPUTE)}, got {recompute!r}")
        self.recompute = recompute

    def prepare_all(self, steps, caches, offsets: torch.Tensor | None = None) -> list[AttentionMeta | None]:
        """``prepare`` per sequence; the sequences whose one query sees the cache's used slots (a decode
        step) read them through the packed kernel with device offsets: one copy for the whole step
        (``one_query_offsets``), or rows of ``offsets`` [n, 4] that the caller keeps up to date (the
        captured decode step, ``models/decode_graphs.py``), one per such sequence in order."""
        metas = [self.prepare(step, cache) for step, cache in zip(steps, caches)]
        single = [i for i, (step, meta) in enumerate(zip(steps, metas)) if meta is None and len(step.slots) == 1]
        if single:
            if offsets is None:
                offsets = one_query_offsets([caches[i].length for i in single], caches[single[0]].keys.device)
            for row, i in enumerate(single):
                metas[i] = AttentionMeta(offsets=offsets[row])
        return metas

    def prepare(self, step, cache: KVCache) -> AttentionMeta | None:
        if step.groups is not None or step.scaling is not None:
            return _masked(step, cache)
        if len(step.slots) > 1:  # a prefill block ending the cache: PyTorch's fused causal attention
            tail = causal_tail_start(step.slots, step.positions, cache.positions, cache.valid, cache.length,
                                     any_device=True)  # fmt: skip
            if tail is not None:
                return AttentionMeta(tail_start=tail)
            if self.recompute == "flex":
                n = cache.length
                return AttentionMeta(block_mask=flex_block_mask(step.positions, cache.positions[:n], cache.valid[:n]))
        return None

    def __call__(self, q: torch.Tensor, cache: KVCache, layer: int, step, meta: AttentionMeta | None) -> torch.Tensor:
        if step.scaling is not None:
            return _scaled(q, cache, layer, step, meta)
        n = cache.length
        keys, values = cache.keys[layer, :, :n], cache.values[layer, :, :n]
        if meta is not None and meta.offsets is not None:  # every slot's KV, the offsets bound them
            return dispatch.q_sparse_attention_varlen(q, step.positions, meta.offsets[:2], cache.keys[layer],
                                                      cache.values[layer], cache.positions, cache.valid,
                                                      meta.offsets[2:], max_seqlen_q=1, backend="triton")  # fmt: skip
        if meta is not None and meta.tail_start is not None:
            return attend_causal_block(q, keys, values, meta.tail_start)
        if meta is not None and meta.block_mask is not None:
            return _flex(q.device.type)(q[None], keys[None], values[None], block_mask=meta.block_mask, enable_gqa=True)[0]
        if meta is not None:
            return attend(q, keys, values, meta.mask, None)
        return dispatch.q_sparse_attention(q, step.positions, keys, values, cache.positions[:n], cache.valid[:n],
                                           backend="triton")  # fmt: skip


def flex_block_mask(q_positions: torch.Tensor, k_positions: torch.Tensor, k_valid: torch.Tensor):
    """FlexAttention's block mask of queries at ``q_positions`` over keys: key j is seen when it is valid
    and its position is at most the query's (the rule of ``kernels/q_sparse_attention.py``)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def visible(b, h, q, k):
        return k_valid[k] & (k_positions[k] <= q_positions[q])

    return create_block_mask(visible, None, None, len(q_positions), len(k_positions), device=q_positions.device)


@functools.cache
def _flex(device_type: str):
    """flex_attention, compiled on CUDA (eager elsewhere: it materialises the scores, for tests)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device_type != "cuda":
        def eager(*args, **kwargs):
            with warnings.catch_warnings():  # eager FlexAttention says it is slow; it is only for checks
                warnings.simplefilter("ignore", UserWarning)
                return flex_attention(*args, **kwargs)

        return eager
    return torch.compile(flex_attention)


def attention_backend(name: str) -> TorchAttention | TritonAttention:
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown attention backend {name!r}; allowed: {', '.join(BACKEND_NAMES)}")
    return TorchAttention() if name == "torch" else TritonAttention()
