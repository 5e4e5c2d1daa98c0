"""Fixed-size KV blocks with reference counts, on one device, within a byte budget.

A block holds the raw (position-free) keys and values of up to ``block`` tokens of every layer,
``[layers, kv_heads, block, head_dim]`` each. Whoever holds a block id holds a reference: the index
that found it, and a reader while it copies from it. A block returns to the free list when its last
reference is dropped, so dropping a block from an index never frees memory a reader is still using,
and a reader never needs a lock while it copies.

Memory is taken in slabs of several blocks as blocks are first needed (an unused pool costs
nothing), up to ``budget_bytes`` or until the device has no more to give; a full pool hands out no
block (``allocate`` returns None) until a holder drops one.
"""

from __future__ import annotations

import threading

import torch

SLAB_BYTES = 64 << 20  # memory is taken this much at a time (at least one block)


class BlockPool:
    def __init__(self, num_layers: int, kv_heads: int, block: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str, budget_bytes: int) -> None:  # fmt: skip
        self.shape = (num_layers, kv_heads, block, head_dim)
        self.dtype, self.device = dtype, torch.device(device)
        self.block_bytes = 2 * num_layers * kv_heads * block * head_dim * torch.empty(0, dtype=dtype).element_size()
        self.capacity = budget_bytes // self.block_bytes  # blocks
        self._slabs: list[torch.Tensor] = []  # [n, 2, layers, kv_heads, block, head_dim]
        self._per_slab = max(1, SLAB_BYTES // self.block_bytes)
        self._refs: list[int] = []  # per block id
        self._free: list[int] = []
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        """Blocks some holder references."""
        with self._lock:
            return len(self._refs) - len(self._free)

    def fits(self, keys: torch.Tensor) -> bool:
        """Whether KV shaped and typed as ``keys`` (``[layers, kv_heads, n, head_dim]``) goes in these blocks."""
        layers, heads, _, head_dim = self.shape
        return keys.dtype == self.dtype and keys.device == self.device and (keys.shape[0], keys.shape[1],
                                                                            keys.shape[3]) == (layers, heads, head_dim)  # fmt: skip

    def allocate(self) -> int | None:
        """A free block's id, referenced once by the caller; None when the budget holds no more."""
        with self._lock:
            if not self._free:
                self._grow()
            if not self._free:
                return None
            block = self._free.pop()
            self._refs[block] = 1
            return block

    def _grow(self) -> None:
        count = min(self._per_slab, self.capacity - len(self._refs))
        if count < 1:
            return
        first = len(self._refs)
        try:
            slab = torch.empty((count, 2, *self.shape), dtype=self.dtype, device=self.device)
        except RuntimeError:  # the device has less free memory than the budget: the pool is full as it is
            self.capacity = first
            return
        self._slabs.append(slab)
        self._refs.extend([0] * count)
        self._free.extend(range(first + count - 1, first - 1, -1))  # lowest id handed out first

    def ref(self, blocks: list[int]) -> None:
        with self._lock:
            for block in blocks:
                if self._refs[block] < 1:
                    raise ValueError(f"block {block} is free: only a holder can share its reference")
                self._refs[block] += 1

    def unref(self, blocks: list[int]) -> None:
        """Drop one reference to each of ``blocks``; a block nobody references is free again."""
        with self._lock:
            for block in blocks:
                if self._refs[block] < 1:
                    raise ValueError(f"block {block} is free already")
                self._refs[block] -= 1
                if not self._refs[block]:
                    self._free.append(block)

    def refs(self, block: int) -> int:
        with self._lock:
            return self._refs[block]

    def kv(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of a block's keys and values, ``[layers, kv_heads, block, head_dim]`` each."""
        slab, row = divmod(block, self._per_slab)
        return self._slabs[slab][row, 0], self._slabs[slab][row, 1]
