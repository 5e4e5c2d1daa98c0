"""Layer-wise loading of a request's stored KV: layer l's entries are placed while layer l - 1 computes.

Cache-Craft (paper 003, section 3.4.2) overlaps moving chunk caches to the GPU with the prefill: while
the GPU runs layer l, the caches of layer l + 1 arrive. Here the context resolver hands every entry
to a ``LayerFeed`` instead of placing it whole (``place`` reserves its slots and sets their positions
at once: the request's layout needs them; the K/V follow). The request cache holds the feed, and the
forward asks for a layer before its attention reads it (``KVCache.ready``); code that reads the
cache any other way settles it first (``KVCache.settle``).

Two ways to feed, the same numbers (each layer is placed exactly as ``place_entry`` places it):

* ``background=True`` (a CUDA cache): a loader thread places layer after layer on a CUDA stream of
  its own (host-to-device copy, dequantisation, rotary, scatter into the cache) and records an event
  per layer; ``ready(l)`` makes the computing stream wait for layer l's event, with no host sync.
  The thread starts after the compute stream's earlier work (the cache's allocation) and every
  layer is queued at once: the destination is the request's own cache, so there is no read buffer
  to bound (the paper's depth ``L_p`` of eq. 16 is then ``L``, the most it can be).
* ``background=False`` (the CPU): ``ready(l)`` places the layers up to l on the calling thread.
  Host memory is already where the compute reads, so nothing overlaps; this mode keeps the
  mechanism exercised (and tested) where there is no copy engine.

The feed keeps references to its entries until every layer is placed, so an entry the store evicts
or unpins meanwhile stays whole for it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.storage import KVEntry, kv_tensors


@dataclass(frozen=True)
class _Pending:
    entry: KVEntry
    slots: torch.Tensor  # [n] cache slots
    positions: torch.Tensor  # [n] their positions


class LayerFeed:
    def __init__(self, model: DecoderLM, cache: KVCache, background: bool | None = None):
        self.model, self.cache = model, cache
        self.background = cache.keys.is_cuda if background is None else background
        self.layers = cache.keys.shape[0]
        self._pending: list[_Pending] = []
        self._tables: list[Any] = []
        self._placed = 0  # layers placed (foreground) or queued (background) so far
        self._events: list[Any] = []
        self._queued = [threading.Event() for _ in range(self.layers)]
        self._error: BaseException | None = None
        self._cancelled = False
        self._thread: threading.Thread | None = None
        self.entries = 0

    def place(self, entry: KVEntry, start_position: int, slots: torch.Tensor | None = None) -> torch.Tensor:
        """``place_entry`` with the K/V deferred: the slots (next free, or ``slots``) and their
        positions now, the layers when asked for."""
        if self._thread is not None or self._placed:
            raise RuntimeError("a LayerFeed takes entries only before it starts")
        cache = self.cache
        slots = cache.reserve(len(entry.token_ids)) if slots is None else slots
        positions = torch.arange(start_position, start_position + len(slots), device=slots.device)
        cache.positions[slots] = positions
        cache.valid[slots] = True
        self._pending.append(_Pending(entry, slots, positions))
        self.entries += 1
        return slots

    def start(self) -> None:
        """Begin feeding (background: start the loader thread). Call once every entry is placed."""
        if self.background and self._pending and self._thread is None:
            compute = torch.cuda.current_stream(self.cache.keys.device)
            self._thread = threading.Thread(target=self._feed_all, args=(compute,), name="fusionrag-layer-feed",
                                            daemon=True)  # fmt: skip
            self._thread.start()

    def ready(self, layer: int) -> None:
        """Layers ``[0, layer]`` of every entry are in the cache (for the current CUDA stream: its
        later work runs after them)."""
        if not self._pending:
            return
        if not self.background:
            with torch.inference_mode():
                while self._placed <= layer:
                    self._place_layer(self._placed)
                    self._placed += 1
            return
        self._queued[layer].wait()
        if self._error is not None:
            raise RuntimeError(f"loading the request's KV failed at layer {layer}") from self._error
        torch.cuda.current_stream(self.cache.keys.device).wait_event(self._events[layer])

    def settle(self) -> None:
        """Every layer placed; the feed lets go of its entries."""
        if self._pending:
            self.ready(self.layers - 1)
        self.close()

    def close(self) -> None:
        """Stop feeding (what is queued still completes) and drop the entries."""
        self._cancelled = True
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._pending = []

    def _feed_all(self, compute) -> None:
        stream = torch.cuda.Stream(device=self.cache.keys.device)
        try:
            with torch.inference_mode(), torch.cuda.stream(stream):
                stream.wait_stream(compute)  # the cache's allocation and zeroing come first
                for layer in range(self.layers):
                    if self._cancelled:
                        raise RuntimeError("the request ended before its KV was loaded")
                    self._place_layer(layer)
                    event = torch.cuda.Event()
                    event.record(stream)
                    self._events.append(event)
                    self._queued[layer].set()
        except BaseException as exc:  # handed to the computing thread at its next ready()
            self._error = exc
            for flag in self._queued:
                flag.set()

    def _place_layer(self, layer: int) -> None:
        cache, model = self.cache, self.model
        if not self._tables:  # one rotary table per entry, shared by its layers (the torch backend's)
            self._tables = [None if model.kernels == "triton" else model.rotary_cos_sin(item.positions)
                            for item in self._pending]  # fmt: skip
        for item, table in zip(self._pending, self._tables):
            keys, values = kv_tensors(item.entry, cache.keys.device, cache.keys.dtype, layer)
            cache.keys[layer, :, item.slots] = model.rotate(keys[0].contiguous(), item.positions, table)
            cache.values[layer, :, item.slots] = values[0]

