"""Reshape one scorer's per-token scores so that the top ``k`` follow another rule.

The selector keeps the ``k`` highest scores; each function here returns new scores whose top ``k``
are the rule's choice:

* ``in_groups``: CacheClip's contiguous groups. Reused tokens are cut into runs of ``size``
  consecutive tokens inside one chunk; every token gets its group's mean score, so whole groups are
  recomputed (the last one may be cut by ``k``).
* ``per_chunk``: the same share of every chunk. A token's score is its rank inside its chunk as a
  fraction of the chunk's length, so the top ``k`` take the best ``k / n`` of each chunk.
* ``rank_union``: the union of two rankings. A token's score is its better rank of the two, so the
  top ``k`` hold about the best ``k / 2`` of each (more of one where they agree).
"""

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


def in_groups(scores: torch.Tensor, layout: RequestLayout, size: int = GROUP_TOKENS) -> torch.Tensor:
    ids = group_ids(layout, size)
    count = int(ids.max()) + 1 if ids.numel() else 0
    totals = torch.zeros(count, dtype=scores.dtype, device=scores.device).index_add_(0, ids, scores)
    sizes = torch.zeros(count, dtype=scores.dtype, device=scores.device).index_add_(0, ids, torch.ones_like(scores))
    return (totals / sizes)[ids]


def per_chunk(scores: torch.Tensor, layout: RequestLayout) -> torch.Tensor:
    chunk = chunk_of(layout)
    shaped = torch.empty_like(scores, dtype=torch.float32)
    for index in torch.unique(chunk).tolist():
        members = torch.nonzero(chunk == index).flatten()
        shaped[members] = 1.0 - (_ranks(scores[members]).float() + 0.5) / members.numel()
    return shaped


def rank_union(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    best = torch.minimum(_ranks(first), _ranks(second)).float()
    return -best - _ranks(first).float() / (4 * max(first.numel(), 1))  # ties: the first ranking decides


def _ranks(scores: torch.Tensor) -> torch.Tensor:
    """0 for the highest score, 1 for the next, ... (ties: the earlier token first)."""
    order = torch.argsort(scores, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(order.numel(), device=order.device)
    return ranks
