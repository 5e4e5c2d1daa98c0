"""A request's own KV buffer: rotated keys and values per layer, addressed by slot.

Slots are storage places; what a token *is* to attention is its absolute position (``positions``)
and whether its KV may be read (``valid``). A query at position p sees every valid slot whose
position is <= p, wherever that slot lies in the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class KVCache:
    keys: torch.Tensor  # [num_layers, num_kv_heads, capacity, head_dim], rotary applied
    values: torch.Tensor  # [num_layers, num_kv_heads, capacity, head_dim]
    positions: torch.Tensor  # [capacity] int64 absolute positions
    valid: torch.Tensor  # [capacity] bool
    groups: torch.Tensor  # [capacity] int32; group 0 is seen by all, others only by their own group
    length: int = 0  # slots [0, length) are in use
    # stored KV still arriving layer by layer (``fusion/layer_feed.LayerFeed``): the forward asks for
    # each layer before reading it (``ready``); anything else reading the cache calls ``settle`` first
    feed: Any = None
    # the ``models/kv_pool.KVPool`` whose buffers these tensors view, from its slot ``pool_start`` on
    pool: Any = None
    pool_start: int = 0

    def ready(self, layer: int) -> None:
        """Layers ``[0, layer]`` hold every stored entry placed in this cache."""
        if self.feed is not None:
            self.feed.ready(layer)

    def settle(self) -> None:
        """Every layer holds every stored entry placed in this cache (then the feed is dropped)."""
        if self.feed is not None:
            feed, self.feed = self.feed, None
            feed.settle()

    @classmethod
    def empty(
        cls,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> "KVCache":
        shape = (num_layers, num_kv_heads, capacity, head_dim)
        return cls.around(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @classmethod
    def around(cls, keys: torch.Tensor, values: torch.Tensor) -> "KVCache":
        """An empty cache whose K/V are the given zeroed tensors ``[layers, kv_heads, capacity, head_dim]``
        (e.g. in memory an earlier cache used, ``models/cache_memory.py``); its slots' positions, validity
        and groups are new."""
        capacity, device = keys.shape[2], keys.device
        return cls(keys, values, torch.zeros(capacity, dtype=torch.long, device=device),
                   torch.zeros(capacity, dtype=torch.bool, device=device),
                   torch.zeros(capacity, dtype=torch.int32, device=device))  # fmt: skip

    def fork(self, into: "KVCache | None" = None) -> "KVCache":
        """An independent copy (its own buffers), e.g. for a second answer to the same prompt; ``into``:
        an empty cache of at least this one's length (e.g. from a pool) the used slots are copied into."""
        self.settle()
        if into is None:
            return KVCache(self.keys.clone(), self.values.clone(), self.positions.clone(), self.valid.clone(),
                           self.groups.clone(), self.length)  # fmt: skip
        used = self.length
        for mine, theirs in ((self.keys, into.keys), (self.values, into.values)):
            theirs[:, :, :used] = mine[:, :, :used]
        for mine, theirs in ((self.positions, into.positions), (self.valid, into.valid), (self.groups, into.groups)):
            theirs[:used] = mine[:used]
        into.length = used
        return into

    def compact(self, index: torch.Tensor) -> "KVCache":
        """A new, smaller cache holding only the slots ``index`` [layers, kv_heads, m] names for each
        (layer, kv-head), in that order, with room for as many more slots as this one had free.

        Decode KV eviction (``models/kv_eviction.py``): each head keeps its own tokens, the same number
        per head, so the cache stays one rectangle. Slot j's position is the latest of the positions it
        holds across heads: every later query (all past the prompt) sees every kept slot, as before.
        This cache's buffers are not changed; dropping it frees the evicted KV.

        >>> cache = KVCache.empty(1, 2, 4, 6, torch.float32, "cpu")
        >>> slots = cache.reserve(4); cache.positions[:4] = slots; cache.valid[:4] = True
        >>> cache.keys[0, :, :4] = torch.arange(4.0)[:, None]
        >>> small = cache.compact(torch.tensor([[[0, 2], [1, 3]]]))
        >>> small.keys[0, :, :2, 0].tolist(), small.positions[:2].tolist(), small.capacity
        ([[0.0, 2.0], [1.0, 3.0]], [1, 3], 4)
        """
        self.settle()
        layers, heads, kept = index.shape
        if layers != self.keys.shape[0] or heads != self.keys.shape[1] or kept > self.length:
            raise ValueError(f"compact needs [layers={self.keys.shape[0]}, kv_heads={self.keys.shape[1]}, m <= "
                             f"{self.length}] slot indices, got {tuple(index.shape)}")
        spare = self.capacity - self.length
        out = KVCache.empty(layers, heads, self.keys.shape[3], kept + spare, self.keys.dtype, self.keys.device)
        gather = index[..., None].expand(-1, -1, -1, self.keys.shape[3])
        out.keys[:, :, :kept] = torch.gather(self.keys[:, :, : self.length], 2, gather)
        out.values[:, :, :kept] = torch.gather(self.values[:, :, : self.length], 2, gather)
        out.positions[:kept] = self.positions[index].flatten(0, 1).max(dim=0).values
        out.valid[:kept] = True
        out.length = kept
        return out

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def reserve(self, count: int) -> torch.Tensor:
        """Take the next ``count`` free slots; returns their indices."""
        if self.length + count > self.capacity:
            raise ValueError(f"KV cache full: {self.length} + {count} slots exceed capacity {self.capacity}")
        slots = torch.arange(self.length, self.length + count, device=self.keys.device)
        self.length += count
        return slots

    def attention_mask(self, query_positions: torch.Tensor, query_groups: torch.Tensor | None = None) -> torch.Tensor:
        """[n, length] bool: which used slots each query may attend to (causal by position).

        With ``query_groups``, a query also sees only group-0 slots and slots of its own group, so
        several independent sequences after a shared prefix can run in one pass.
        """
        positions = self.positions[: self.length]
        mask = self.valid[: self.length][None, :] & (positions[None, :] <= query_positions[:, None])
        if query_groups is not None:
            groups = self.groups[: self.length][None, :]
            mask &= (groups == 0) | (groups == query_groups[:, None])
        return mask
