"""Random: a seeded random subset, the floor every informed selector must beat.

Scores rank the tokens in the order of one seeded permutation, so the top ``k`` are its first ``k``.
"""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.layout import ScoringInput


def scores(inp: ScoringInput) -> torch.Tensor:
    reused = inp.layout.reused_slots
    n = len(reused)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(inp.seed))
    ranks = torch.empty(n, dtype=torch.float32)
    ranks[order] = torch.arange(n, 0, -1, dtype=torch.float32)  # first in the permutation scores highest
    return ranks.to(reused.device)
