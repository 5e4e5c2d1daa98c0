"""Where each reused token sits: its chunk (``chunk_of``) and its run of ``GROUP_TOKENS`` consecutive
tokens inside that chunk (``group_ids``, CacheClip's windows)."""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.layout import RequestLayout

GROUP_TOKENS = 8  # CacheClip's group length


def chunk_of(layout: RequestLayout) -> torch.Tensor:
    """The index (in prompt order) of the chunk holding each reused slot; -1 for none."""
    slots = layout.reused_slots
    if not layout.chunk_spans:
        return torch.zeros_like(slots)
    starts = torch.tensor([start for start, _ in layout.chunk_spans], device=slots.device)
    return torch.searchsorted(starts, slots, right=True) - 1


def group_ids(layout: RequestLayout, size: int = GROUP_TOKENS) -> torch.Tensor:
    """A group id per reused slot: runs of consecutive slots inside one chunk, cut every ``size``."""
    slots = layout.reused_slots
    n = slots.numel()
    if n == 0:
        return slots.clone()
    chunk = chunk_of(layout)
    starts_run = torch.ones(n, dtype=torch.bool, device=slots.device)
    starts_run[1:] = (slots[1:] != slots[:-1] + 1) | (chunk[1:] != chunk[:-1])
    run = torch.cumsum(starts_run.long(), 0) - 1
    first = torch.nonzero(starts_run).flatten()  # index of each run's first slot
    offset = torch.arange(n, device=slots.device) - first[run]
    pieces = offset // size
    keys = run * (int(pieces.max()) + 1) + pieces
    return torch.unique(keys, return_inverse=True)[1]
