"""Request caches carved from one device buffer, so a decode step reads every sequence in one call.

A request's ``KVCache`` is a dense rectangle ``[layers, kv_heads, capacity, head_dim]``. Made one by one,
the caches of a batch sit apart in memory and attention runs once per sequence and layer: on a GPU,
thousands of small kernels per decode step. ``KVPool`` holds one buffer per cache tensor
(``[layers, kv_heads, slots, head_dim]`` keys and values; positions, validity and groups per slot) and
hands out caches that are views of a span of its slots (one more slot, past them, takes the rows
that pad a captured decode step to its size), so a cache is used exactly as a dense one
(every method, placement and write reads and writes through the views), while a step whose sequences
all live in one pool writes their new K/V with one indexed write per layer and attends with one call
of the span kernel (``kernels/q_sparse_attention_varlen.q_sparse_attention_spans``).

A span is taken first-fit and comes back to the pool when its cache is garbage-collected (a finalizer
on the cache object; every copy the engine keeps of a cache's KV is a copy, not a view). A pool does
not grow (its addresses are in captured graphs). The first one holds the cache slots the engine's
scheduler lets its sequences hold together (``new_cache``'s ``first_slots``), so the sequences of a
step share one pool and one attention call; where the device cannot give that much when it is made,
it is halved until it can. ``KVPools`` makes another one when none has room (spans left apart, a cache kept after
its request), of ``POOL_BYTES`` (or ``POOL_SHARE`` of the device's free memory, if less); a cache
larger than that is a dense one of its own.
"""

from __future__ import annotations

import threading
import weakref

import torch

from fusionrag_llm.models.kv_cache import KVCache

POOL_BYTES = 4 << 30  # one pool's K and V, on a GPU
POOL_SHARE = 0.25  # at most this part of the device's free memory per new pool


def slot_bytes(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one cache slot: K and V of every layer."""
    return 2 * num_layers * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


class KVPool:
    """Spans of ``slots`` cache slots of one model's shape; ``allocate`` gives a cache or None (full)."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, slots: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:  # fmt: skip
        shape = (num_layers, kv_heads, slots + 1, head_dim)  # and one slot past them for padding rows
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.positions = torch.zeros(slots + 1, dtype=torch.long, device=device)
        self.valid = torch.zeros(slots + 1, dtype=torch.bool, device=device)
        self.groups = torch.zeros(slots + 1, dtype=torch.int32, device=device)
        self.slots = slots
        self._free = [(0, slots)]  # (start, length), by start; neighbours merged
        self._lock = threading.Lock()
        # A one-slot cache past the spans, never handed out: the rows that pad a captured decode step to
        # its size write and read only there (``models/decode_graphs.py``).
        self.padding = self._view(slots, 1, length=1)

    @property
    def free_slots(self) -> int:
        with self._lock:
            return sum(length for _, length in self._free)

    def allocate(self, capacity: int) -> KVCache | None:
        """A cache of ``capacity`` slots over the first free span that holds it (cleared), or None."""
        if capacity < 1:
            raise ValueError(f"a cache needs at least one slot, got capacity {capacity}")
        with self._lock:
            index = next((i for i, (_, length) in enumerate(self._free) if length >= capacity), None)
            if index is None:
                return None
            start, length = self._free[index]
            if length == capacity:
                del self._free[index]
            else:
                self._free[index] = (start + capacity, length - capacity)
        span = slice(start, start + capacity)
        for tensor in (self.keys, self.values):
            tensor[:, :, span].zero_()
        for tensor in (self.positions, self.valid, self.groups):
            tensor[span].zero_()
        cache = self._view(start, capacity)
        weakref.finalize(cache, self._release, start, capacity)
        return cache

    def _view(self, start: int, capacity: int, length: int = 0) -> KVCache:
        """A cache over slots ``[start, start + capacity)`` of the pool's buffers, ``length`` of them used."""
        span = slice(start, start + capacity)
        return KVCache(self.keys[:, :, span], self.values[:, :, span], self.positions[span], self.valid[span],
                       self.groups[span], length=length, pool=self, pool_start=start)  # fmt: skip

    def _release(self, start: int, capacity: int) -> None:
        with self._lock:
            spans = sorted([*self._free, (start, capacity)])
            merged = [spans[0]]
            for begin, length in spans[1:]:
                last_begin, last_length = merged[-1]
                if last_begin + last_length == begin:
                    merged[-1] = (last_begin, last_length + length)
                else:
                    merged.append((begin, length))
            self._free = merged


class KVPools:
    """A model's pools: a cache from the first with room, else from a new one (module docstring)."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 pool_bytes: int = POOL_BYTES) -> None:  # fmt: skip
        self.shape = (num_layers, kv_heads, head_dim)
        self.dtype, self.device, self.pool_bytes = dtype, torch.device(device), pool_bytes
        self.slot_bytes = slot_bytes(num_layers, kv_heads, head_dim, dtype)
        self.pools: list[KVPool] = []

    @classmethod
    def of(cls, model, pool_bytes: int = POOL_BYTES) -> KVPools:
        cfg = model.cfg
        return cls(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device, pool_bytes)

    def new_cache(self, capacity: int, first_slots: int | None = None) -> KVCache | None:
        """A pooled cache of ``capacity`` slots, or None when no pool has room and no new one fits;
        ``first_slots``: the slots of the first pool, if it is made now (None: as any other)."""
        for pool in self.pools:
            cache = pool.allocate(capacity)
            if cache is not None:
                return cache
        if not self.pools and first_slots is not None:
            slots = first_slots
        else:
            budget = self.pool_bytes
            if self.device.type == "cuda":
                budget = min(budget, int(torch.cuda.mem_get_info(self.device)[0] * POOL_SHARE))
            slots = budget // self.slot_bytes
        while slots >= capacity:  # a cache larger than a pool may be: a dense one of its own
            try:
                pool = KVPool(*self.shape, slots, self.dtype, self.device)
            except torch.OutOfMemoryError:
                slots //= 2  # the device has less free than when the size was chosen
                continue
            self.pools.append(pool)
            return pool.allocate(capacity)
        return None
