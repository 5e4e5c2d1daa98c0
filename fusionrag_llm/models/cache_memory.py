"""Request caches on the CPU made in memory the process already has.

A request's cache is large (K and V of every layer for its prompt and answer: ~290 MB at 6.2k tokens
of SmolLM2-135M in float32), and memory that large comes fresh from the operating system, page by
page as it is first written: zeroing two such buffers took ~60 ms, against ~9 ms for memory the
process has written before, and ``full_reuse``'s time to the first token at 6.2k tokens went from
320 to 277 ms with reused memory (interleaved runs in one process).
``CacheMemory`` keeps the K/V buffers of the caches it made and gives a buffer to a new cache (zeroed)
once nothing views it any more: not the finished cache, nor any tensor cut from it (a buffer's storage
is shared by every view of it, and counts them). So a view someone kept of a finished cache's KV is
never overwritten: its buffer simply is not reused while it lives. It keeps at most ``KEEP`` buffers,
in use or not (a new one takes the place of the smallest unused one), so an idle engine holds at most
``KEEP`` recent caches' memory; caches beyond them come and go as before.

On a GPU the device's caching allocator already reuses freed memory, and request caches come from
pools (``models/kv_pool.py``): this is for the CPU.
"""

from __future__ import annotations

import threading

import torch

from fusionrag_llm.models.kv_cache import KVCache

KEEP = 4  # buffers kept for the next caches, in use or not (each as large as the largest cache it served)
_use_count = getattr(torch._C, "_storage_Use_Count", None)  # None: no reuse (the count cannot be read)


class CacheMemory:
    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._buffers: list[torch.Tensor] = []  # flat; K then V of the caches made in them
        self._lock = threading.Lock()

    def new_cache(self, num_layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
                  device: torch.device | str) -> KVCache:  # fmt: skip
        """A zeroed cache of ``capacity`` slots (as ``KVCache.empty``), its K/V in a reused buffer where one
        is free and large enough."""
        shape = (num_layers, kv_heads, capacity, head_dim)
        numel = num_layers * kv_heads * capacity * head_dim
        kv = self._take(2 * numel, dtype, torch.device(device))
        kv.zero_()
        return KVCache.around(kv[:numel].view(shape), kv[numel:].view(shape))

    @property
    def held(self) -> int:
        """Buffers kept now, in use or not."""
        with self._lock:
            return len(self._buffers)

    def _take(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The first ``numel`` elements of a free buffer, or of a new one (a view made under the lock, so
        no other caller finds that buffer free). A new buffer is kept when fewer than ``keep`` are, after
        letting go of the smallest unused one if need be."""
        with self._lock:
            free = [b for b in self._buffers if _unused(b)]
            fits = [b for b in free if b.dtype == dtype and b.device == device and b.numel() >= numel]
            if fits:
                return min(fits, key=torch.Tensor.numel)[:numel]
            made = torch.empty(numel, dtype=dtype, device=device)
            if _use_count is not None:
                if len(self._buffers) >= self.keep and free:
                    smallest = min(free, key=torch.Tensor.numel)
                    self._buffers = [b for b in self._buffers if b is not smallest]
                if len(self._buffers) < self.keep:
                    self._buffers.append(made)
            return made[:numel]


def _unused(buffer: torch.Tensor) -> bool:
    """No tensor but ``buffer`` itself holds its storage (the count includes the storage object made to
    read it)."""
    return _use_count(buffer.untyped_storage()._cdata) <= 2
