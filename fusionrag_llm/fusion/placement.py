"""Placing a stored entry into a request's cache: rotary at the positions it takes there (and back).

Stored keys are position-free (before rotary), so one entry serves any position of any prompt.
A quantized entry is moved packed and expanded on the cache's device (``storage/quantize.py``).
"""

from __future__ import annotations

import torch

from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.storage import KVEntry, kv_tensors


def place_entry(model: DecoderLM, cache: KVCache, entry: KVEntry, start_position: int,
                slots: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Put ``entry`` into the next slots (or into ``slots``, to replace what is there) at consecutive
    positions from ``start_position``; returns the slots."""
    slots = cache.reserve(len(entry.token_ids)) if slots is None else slots
    positions = torch.arange(start_position, start_position + len(slots), device=slots.device)
    keys, values = kv_tensors(entry, cache.keys.device, cache.keys.dtype)  # a packed entry expands on the device
    cache.keys[:, :, slots] = model.rotate(keys.contiguous(), positions)
    cache.values[:, :, slots] = values
    cache.positions[slots] = positions
    cache.valid[slots] = True
    return slots


def position_free_kv(model: DecoderLM, cache: KVCache, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V of ``cache`` slots ``[start, end)`` as an entry stores them: keys rotated back from
    the positions they hold there (``[layers, kv_heads, end - start, head_dim]``; values are views)."""
    return model.rotate(cache.keys[:, :, start:end], -cache.positions[start:end]), cache.values[:, :, start:end]
