"""EPIC (LegoLink): recompute the first tokens of every chunk, where a chunk encoded alone put its
attention sinks. No forward pass: the score is the token's offset in its chunk (earlier = higher),
so the top ``k`` are the first ``k / chunks`` tokens of every reused chunk (ties: earlier chunk)."""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.layout import ScoringInput
from fusionrag_llm.fusion.scorers.shaping import chunk_of


def scores(inp: ScoringInput) -> torch.Tensor:
    layout = inp.layout
    slots = layout.reused_slots
    starts = torch.tensor([start for start, _ in layout.chunk_spans] or [0], device=slots.device)
    offset = (slots - starts[chunk_of(layout)]).double()
    return -(offset + slots.double() / (int(slots.max()) + 1 if slots.numel() else 1))  # the tie-break is < 1
