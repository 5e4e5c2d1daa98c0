"""Placing a stored entry into a request's cache: rotary at the positions it takes there (and back).

Stored keys are position-free (before rotary), so one entry serves any position of any prompt,
and any of its rows from the first on (a chunk whose first word the prompt glued to the text before
serves from its ``k``-th row). A quantized entry is moved packed and expanded on the cache's device
(``storage/quantize.py``), then cut.
"""

from __future__ import annotations

import torch

from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.storage import KVEntry, kv_tensors


def place_entry(model: DecoderLM, cache: KVCache, entry: KVEntry, start_position: int,
                slots: torch.Tensor | None = None, first_row: int = 0) -> torch.Tensor:  # fmt: skip
    """Put ``entry``'s rows from ``first_row`` on into the next slots (or into ``slots``, to replace
    what is there) at consecutive positions from ``start_position``; returns the slots."""
    slots = cache.reserve(len(entry.token_ids) - first_row) if slots is None else slots
    positions = torch.arange(start_position, start_position + len(slots), device=slots.device)
    keys, values = kv_tensors(entry, cache.keys.device, cache.keys.dtype)  # a packed entry expands on the device
    keys, values = keys[:, :, first_row:], values[:, :, first_row:]
    model.rotate_into(cache.keys, slots, keys, positions)
    cache.values[:, :, slots] = values
    cache.positions[slots] = positions
    cache.valid[slots] = True
    return slots


def entry_rows(entry: KVEntry, first_row: int) -> KVEntry:
    """``entry`` from row ``first_row`` on, as views (an unpacked entry's; a packed one is cut by
    ``place_entry`` once expanded, since its scales may span rows)."""
    if first_row == 0:
        return entry
    rows = slice(first_row, None)
    return KVEntry(entry.token_ids[rows], entry.keys[:, :, rows], entry.values[:, :, rows], entry.meta)


def position_free_kv(model: DecoderLM, cache: KVCache, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V of ``cache`` slots ``[start, end)`` as an entry stores them: keys rotated back from
    the positions they hold there (``[layers, kv_heads, end - start, head_dim]``; values are views)."""
    return model.rotate(cache.keys[:, :, start:end], -cache.positions[start:end]), cache.values[:, :, start:end]
