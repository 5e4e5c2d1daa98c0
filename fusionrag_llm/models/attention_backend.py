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
from collections import Counter
from dataclasses import dataclass

import torch

from fusionrag_llm.kernels import dispatch
from fusionrag_llm.models.attention import (SortedQueries, attend, attend_causal_block, attend_scaled, causal_tail_start,
                                           dense_sorted)
from fusionrag_llm.models.forward import spans_of
from fusionrag_llm.models.kv_cache import KVCache

BACKEND_NAMES = ("torch", "triton")


@dataclass
class AttentionMeta:
    mask: torch.Tensor | None = None  # [1, 1, n, length] position (and group) mask, when no fast path applies
    tail_start: int | None = None  # the step is a causal block ending the cache, from this slot
    sorted_queries: SortedQueries | None = None  # sorted queries over a cache where slot j is position j
    # one query over the cache's used slots (Triton): device views of the span kernel's query offsets
    # [0, 1] and the slots [start, end) it reads, so neither the call nor its shapes depend on the length
    # (no sync, graph-capturable); see ``span_offsets``
    query_offsets: torch.Tensor | None = None
    key_start: torch.Tensor | None = None
    key_end: torch.Tensor | None = None
    block_mask: object = None  # FlexAttention's block mask of a recompute step (TritonAttention.recompute)


@dataclass
class PooledStep:
    """The sequences of a step whose caches live in one ``KVPool`` and whose queries follow the kernel's
    rule (decode tokens, sparse recomputes): each layer writes their new K/V with one indexed write and
    attends them with one call (``TritonAttention.attend_pooled``); the step's other sequences (a causal
    block, a masked step, a cache of its own) attend one by one beside them."""

    pool: object  # models/kv_pool.KVPool
    query_offsets: torch.Tensor  # [n + 1]: where each pooled sequence's queries start in its rows
    key_starts: torch.Tensor  # [n] each cache's first pool slot
    key_ends: torch.Tensor  # [n] one past its last used slot
    slots: torch.Tensor  # [rows] the pool slots the tokens' K/V go to
    positions: torch.Tensor  # [rows] the tokens' positions
    max_queries: int = 1  # the most queries of one sequence (sizes the kernel's grid)
    per_sequence: bool = False  # some sequence has layer hooks or KV still arriving: run those per sequence
    members: tuple[int, ...] | None = None  # the pooled sequences' indices in the step; None: all of them
    rows: slice | torch.Tensor | None = None  # their rows in the step's stacked tokens; None: all


def shared_pool(caches) -> object | None:
    """The pool every cache lives in, if they share one (else None)."""
    pool = caches[0].pool if caches else None
    return pool if pool is not None and all(cache.pool is pool for cache in caches) else None


def span_offsets(caches, pooled: bool, queries: list[int] | None = None) -> list[int]:
    """The span kernel's offsets in one list: where each cache's queries start (``queries`` per cache;
    default one each: ``0..n``) and the end, then each cache's first slot and one past its last used
    slot, in the pool's numbering when ``pooled``, else in its own (from 0)."""
    starts = [cache.pool_start if pooled else 0 for cache in caches]
    offsets = [0]
    for count in queries or [1] * len(caches):
        offsets.append(offsets[-1] + count)
    return [*offsets, *starts, *(start + cache.length for start, cache in zip(starts, caches))]


def device_ints(values: list[int], device: torch.device) -> torch.Tensor:
    """``values`` as int64 on ``device`` in one copy that does not wait for the device."""
    host = torch.tensor(values, dtype=torch.int64)
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

    def prepare_all(self, steps, caches, positions: torch.Tensor,
                    offsets: torch.Tensor | None = None) -> tuple[list, PooledStep | None]:  # fmt: skip
        """Every sequence's ``prepare``, and the step's ``PooledStep`` where the backend runs one (see
        ``TritonAttention.prepare_all``; ``positions``: every step's, in order; ``offsets`` too)."""
        return [self.prepare(step, cache) for step, cache in zip(steps, caches)], None


class TorchAttention(_Backend):
    name = "torch"

    def prepare(self, step, cache: KVCache) -> AttentionMeta:
        if step.groups is not None or step.scaling is not None:
            return _masked(step, cache)
        tail = causal_tail_start(step.slots, step.positions, cache.positions, cache.valid, cache.length)
        if tail is not None:
            return AttentionMeta(tail_start=tail)
        if dense_sorted(step.positions, cache.positions, cache.valid, cache.length):
            return AttentionMeta(sorted_queries=SortedQueries(step.positions))
        return _masked(step, cache)

    def __call__(self, q: torch.Tensor, cache: KVCache, layer: int, step, meta: AttentionMeta) -> torch.Tensor:
        if step.scaling is not None:
            return _scaled(q, cache, layer, step, meta)
        n = cache.length
        return attend(q, cache.keys[layer, :, :n], cache.values[layer, :, :n], meta.mask, meta.tail_start,
                      meta.sorted_queries)  # fmt: skip


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

    def prepare_all(self, steps, caches, positions: torch.Tensor,
                    offsets: torch.Tensor | None = None) -> tuple[list, PooledStep | None]:  # fmt: skip
        """``prepare`` per sequence, then one call for as many as can share it: the sequences whose queries
        follow the kernel's rule (one query over the used slots, a decode step, or a sparse recompute; no
        causal block, no mask) and whose caches live in one pool (the pool most of them share) make the
        step's ``PooledStep``: one K/V write and one attention call per layer for all of them, with device
        offsets (``span_offsets``) in one copy, or ``offsets``, which the caller keeps up to date (the
        captured decode step, ``models/decode_graphs.py``: every sequence, one query each). The others
        attend one by one; those whose one query sees the cache's used slots read them through the span
        kernel, each alone."""
        metas = [self.prepare(step, cache) for step, cache in zip(steps, caches)]
        if offsets is None:
            members, pool = _pool_members(metas, caches)
        else:  # a captured step: all in one pool, or each alone
            pool = shared_pool(caches) if all(meta is None for meta in metas) else None
            members = list(range(len(steps))) if pool is not None else []
        pooled = self._pooled(steps, caches, positions, pool, members, offsets) if pool is not None else None
        pooled_ones = set(members)
        single = [i for i, (step, meta) in enumerate(zip(steps, metas))
                  if meta is None and len(step.slots) == 1 and i not in pooled_ones]  # fmt: skip
        if single:
            if offsets is None:
                offsets = device_ints(span_offsets([caches[i] for i in single], False), caches[single[0]].keys.device)
            m = len(single)
            starts, ends = offsets[m + 1 : 2 * m + 1], offsets[2 * m + 1 :]
            for row, i in enumerate(single):
                metas[i] = AttentionMeta(query_offsets=offsets[:2], key_start=starts[row : row + 1], key_end=ends[row : row + 1])
        return metas, pooled

    @staticmethod
    def _pooled(steps, caches, positions: torch.Tensor, pool, members: list[int],
                offsets: torch.Tensor | None) -> PooledStep:  # fmt: skip
        """The ``PooledStep`` of the sequences ``members`` (their caches all in ``pool``)."""
        chosen, counts = [caches[i] for i in members], [len(steps[i].slots) for i in members]
        n = len(members)
        if offsets is None:
            offsets = device_ints(span_offsets(chosen, True, counts), chosen[0].keys.device)
        queries, starts, ends = offsets[: n + 1], offsets[n + 1 : 2 * n + 1], offsets[2 * n + 1 :]
        if max(counts) == 1:  # one token each: its slot read from the offsets (a captured step's come from there)
            slots = (steps[members[0]].slots if n == 1 else torch.cat([steps[i].slots for i in members])) + starts
        else:
            slots = torch.cat([steps[i].slots + caches[i].pool_start for i in members])
        every = n == len(steps)
        rows = None if every else _member_rows(steps, members, positions.device)
        hooked = any(steps[i].hooks for i in members) or any(cache.feed is not None for cache in chosen)
        return PooledStep(pool, queries, starts, ends, slots, positions if every else positions[rows], max(counts),
                          hooked, None if every else tuple(members), rows)  # fmt: skip

    def attend_pooled(self, q: torch.Tensor, step: PooledStep, layer: int) -> torch.Tensor:
        """Every sequence's queries over its span of the pool (the new K/V already written there)."""
        pool = step.pool
        return dispatch.q_sparse_attention_spans(q, step.positions, step.query_offsets, pool.keys[layer],
                                                 pool.values[layer], pool.positions, pool.valid, step.key_starts,
                                                 step.key_ends, step.max_queries, backend="triton")  # fmt: skip

    def prepare(self, step, cache: KVCache) -> AttentionMeta | None:
        if step.groups is not None or step.scaling is not None:
            return _masked(step, cache)
        if len(step.slots) > 1:  # a prefill block ending the cache: PyTorch's fused causal attention
            tail = None if step.scattered else causal_tail_start(step.slots, step.positions, cache.positions,
                                                                 cache.valid, cache.length, any_device=True)  # fmt: skip
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
        if meta is not None and meta.query_offsets is not None:  # every slot's KV, the offsets bound them
            return dispatch.q_sparse_attention_spans(q, step.positions, meta.query_offsets, cache.keys[layer],
                                                     cache.values[layer], cache.positions, cache.valid,
                                                     meta.key_start, meta.key_end, 1, backend="triton")  # fmt: skip
        if meta is not None and meta.tail_start is not None:
            return attend_causal_block(q, keys, values, meta.tail_start)
        if meta is not None and meta.block_mask is not None:
            return _flex(q.device.type)(q[None], keys[None], values[None], block_mask=meta.block_mask, enable_gqa=True)[0]
        if meta is not None:
            return attend(q, keys, values, meta.mask, None)
        return dispatch.q_sparse_attention(q, step.positions, keys, values, cache.positions[:n], cache.valid[:n],
                                           backend="triton")  # fmt: skip


def _pool_members(metas, caches) -> tuple[list[int], object | None]:
    """The sequences that can attend in one call: those the kernel takes as they are (``meta`` None)
    whose caches live in the pool most of them share; and that pool (None: no such sequence)."""
    shares = Counter(id(cache.pool) for cache, meta in zip(caches, metas) if meta is None and cache.pool is not None)
    if not shares:
        return [], None
    most = shares.most_common(1)[0][0]
    members = [i for i, (cache, meta) in enumerate(zip(caches, metas)) if meta is None and id(cache.pool) == most]
    return members, caches[members[0]].pool


def _member_rows(steps, members: list[int], device: torch.device) -> slice | torch.Tensor:
    """The rows of ``members`` in the step's stacked tokens: a slice where they are consecutive."""
    spans = spans_of(steps)
    if members == list(range(members[0], members[-1] + 1)):
        return slice(spans[members[0]][0], spans[members[-1]][1])
    return device_ints([row for i in members for row in range(*spans[i])], device)


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
