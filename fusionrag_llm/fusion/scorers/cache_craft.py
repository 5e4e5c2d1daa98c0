"""Cache-Craft (paper 003, section 3.2.1): in each chunk, the tokens its variant's computation saw
attending most to the chunks before it, as many per chunk as its Cache Fix Overhead asks.

No forward pass: the variant choice (``variant_policy="cfo"``) already put each chunk's overhead
and token order in the layout (``RequestLayout.chunk_fix`` / ``chunk_order``, see
``fusion/craft.py``). ``scores`` ranks every reused token inside its chunk by that order (a chunk
without one: its first tokens first); ``pick`` shares the run's ``k`` over the chunks in proportion
to overhead x length (``craft.chunk_budgets``) and takes each chunk's best.
"""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.craft import chunk_budgets
from fusionrag_llm.fusion.layout import RequestLayout, ScoringInput
from fusionrag_llm.fusion.scorers.shaping import chunk_of


def scores(inp: ScoringInput) -> torch.Tensor:
    """Per reused token: minus its rank in its chunk's order (higher = recompute first)."""
    layout = inp.layout
    slots, chunk = layout.reused_slots, chunk_of(layout)
    ranks = torch.empty(len(slots), dtype=torch.float64, device=slots.device)
    for index in torch.unique(chunk).tolist():
        members = torch.nonzero(chunk == index).flatten()
        start = layout.chunk_spans[index][0] if layout.chunk_spans else 0
        offsets = (slots[members] - start).tolist()
        order = layout.chunk_order[index] if index < len(layout.chunk_order) else ()
        rank_of = {token: rank for rank, token in enumerate(order)}
        ranks[members] = torch.tensor([rank_of.get(t, len(order) + t) for t in offsets], dtype=torch.float64,
                                      device=slots.device)
    return -ranks


def pick(layout: RequestLayout, scores: torch.Tensor, k: int) -> torch.Tensor:
    slots, chunk = layout.reused_slots, chunk_of(layout)
    indices = torch.unique(chunk).tolist()
    members = [torch.nonzero(chunk == i).flatten() for i in indices]
    fix = [layout.chunk_fix[i] if i < len(layout.chunk_fix) else 1.0 for i in indices]
    budgets = chunk_budgets(fix, [len(m) for m in members], k)
    chosen = [slots[m[torch.topk(scores[m], b).indices]] for m, b in zip(members, budgets) if b > 0]
    return torch.cat(chosen).sort().values if chosen else slots[:0]
