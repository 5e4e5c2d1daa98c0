"""Layer-wise loading of a request's stored KV: layer l's entries arrive while the layers before compute.

Cache-Craft (paper 003, section 3.4.2) overlaps moving chunk caches to the GPU with the prefill: while
the GPU runs layer l, the caches of the next layers arrive. Here the context resolver hands every
entry to a ``LayerFeed`` instead of placing it whole (``place`` reserves its slots and sets their
positions at once, since the request's layout needs them; the K/V follow). The request cache holds
the feed, and the forward asks for each layer before its attention reads it (``KVCache.ready``);
code that reads the cache any other way settles it first (``KVCache.settle``).

How it is fed:

* ``start`` queues, on a CUDA stream of its own, the host-to-device copies of every entry's K/V in
  layer groups of growing size (layer 0, 1, 2-3, 4-7, ...: the first layer waits for one layer's
  copy, and later groups have the layers before them to hide behind), each group closed by an event.
  Every copy is queued at once, from pinned host memory (the store pins its host tier beside a GPU),
  so no thread is needed: the copy engine works while the computing stream runs. The paper bounds
  the layers loaded ahead by a read buffer (depth ``L_p``, eq. 16); here the staging copies are
  freed as their layers are placed, and at most every layer is ahead (``L_p = L``).
* ``ready(l)`` makes the computing stream wait for layer l's group, then places layer l of every
  entry in one go: the entries' layer-l K/V side by side, rotary at their positions (one table for
  the request, made at start), written into their slots. Entries already on the device (the store's
  device tier) are read where they are, with no copy.
* On the CPU there is nothing to copy: ``ready(l)`` places layer l from the entries themselves. The
  mechanism, and its numbers, are the same everywhere (each layer lands exactly as ``place_entry``
  would place it), which is what the CPU tests check.

Packed (quantized) entries are placed whole when handed over: expanding them layer by layer is not
built. The feed keeps references to its entries until every layer is placed, so an entry the store
evicts or unpins meanwhile stays whole for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fusionrag_llm.fusion.placement import entry_rows, place_entry
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.storage import KVEntry


@dataclass
class _Group:
    """Layers ``[start, end)`` of every entry, on the cache's device once ``event`` has passed."""

    start: int
    end: int
    keys: list[torch.Tensor]  # per entry [end - start, kv_heads, n, head_dim]
    values: list[torch.Tensor]
    event: Any = None  # torch.cuda.Event; None: nothing to wait for


class LayerFeed:
    def __init__(self, model: DecoderLM, cache: KVCache):
        self.model, self.cache = model, cache
        self.layers = cache.keys.shape[0]
        self._entries: list[KVEntry] = []
        self._slots: list[torch.Tensor] = []
        self._positions: list[torch.Tensor] = []
        self._groups: list[_Group] = []
        self._started = False
        self._placed = 0  # layers [0, _placed) are in the cache
        self._all_slots: torch.Tensor | None = None  # [n] every entry's slots, in order
        self._all_positions: torch.Tensor | None = None  # [n] their positions
        self._table: Any = None  # the rotary cos/sin of those positions (torch kernels)

    @property
    def entries(self) -> int:
        return len(self._entries)

    def place(self, entry: KVEntry, start_position: int, first_row: int = 0) -> torch.Tensor:
        """``place_entry`` with the K/V deferred: the next free slots and their positions now, the
        layers when asked for (a packed entry: whole, now)."""
        if self._started:
            raise RuntimeError("a LayerFeed takes entries only before it starts")
        if entry.extras:
            return place_entry(self.model, self.cache, entry, start_position, first_row=first_row)
        entry, cache = entry_rows(entry, first_row), self.cache
        slots = cache.reserve(len(entry.token_ids))
        positions = torch.arange(start_position, start_position + len(slots), device=slots.device)
        cache.positions[slots] = positions
        cache.valid[slots] = True
        self._entries.append(entry)
        self._slots.append(slots)
        self._positions.append(positions)
        return slots

    def start(self) -> None:
        """Queue the copies (CUDA) and make the rotary table; call once every entry is handed over."""
        self._started = True
        if not self._entries:
            return
        positions = torch.cat(self._positions)
        self._all_slots = torch.cat(self._slots)
        self._table = None if self.model.kernels == "triton" else self.model.rotary_cos_sin(positions)
        self._all_positions = positions
        device = self.cache.keys.device
        copy = device.type == "cuda" and any(entry.device != device for entry in self._entries)
        stream = torch.cuda.Stream(device=device) if copy else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(device))  # the cache's allocation comes first
        for start, end in layer_groups(self.layers):
            self._groups.append(self._stage(start, end, stream))

    def _stage(self, start: int, end: int, stream) -> _Group:
        """Layers ``[start, end)`` of every entry moved to the cache's device (queued on ``stream``)."""
        device = self.cache.keys.device
        if stream is None:
            return _Group(start, end, [e.keys[start:end] for e in self._entries], [e.values[start:end] for e in self._entries])
        compute = torch.cuda.current_stream(device)
        keys, values = [], []
        with torch.cuda.stream(stream):
            for entry in self._entries:
                pair = entry.keys[start:end], entry.values[start:end]
                if entry.device != device:
                    pair = tuple(t.to(device, non_blocking=True) for t in pair)
                    for tensor in pair:  # made on the copy stream, read on the computing one
                        tensor.record_stream(compute)
                keys.append(pair[0])
                values.append(pair[1])
            event = torch.cuda.Event()
            event.record(stream)
        return _Group(start, end, keys, values, event)

    def ready(self, layer: int) -> None:
        """Layers ``[0, layer]`` of every entry are in the cache (for the current CUDA stream: its
        later work runs after them)."""
        if not self._entries:
            return
        with torch.inference_mode():
            while self._placed <= layer:
                self._place_layer(self._placed)
                self._placed += 1

    def _place_layer(self, layer: int) -> None:
        group = next(g for g in self._groups if g.start <= layer < g.end)
        if group.event is not None:
            torch.cuda.current_stream(self.cache.keys.device).wait_event(group.event)
        cache, index = self.cache, layer - group.start
        keys = torch.cat([k[index] for k in group.keys], dim=1).to(cache.keys.dtype)  # [kv_heads, n, d]
        values = torch.cat([v[index] for v in group.values], dim=1).to(cache.values.dtype)
        self.model.rotate_into(cache.keys[layer], self._all_slots, keys, self._all_positions, self._table)
        cache.values[layer, :, self._all_slots] = values
        if layer == group.end - 1:  # the group's staging copies are no longer needed
            group.keys, group.values = [], []

    def settle(self) -> None:
        """Every layer placed; the feed lets go of its entries."""
        self.ready(self.layers - 1)
        self.close()

    def close(self) -> None:
        """Drop the entries and what was staged (queued copies complete on their own stream)."""
        self._entries, self._slots, self._positions, self._groups = [], [], [], []


def layer_groups(layers: int) -> list[tuple[int, int]]:
    """``[start, end)`` groups of growing size: 0, 1, 2-3, 4-7, ... (the last one cut at ``layers``).

    >>> layer_groups(12)
    [(0, 1), (1, 2), (2, 4), (4, 8), (8, 12)]
    """
    groups, start, size = [], 0, 1
    while start < layers:
        end = min(layers, start + size)
        groups.append((start, end))
        start, size = end, size if start == 0 else size * 2
    return groups

