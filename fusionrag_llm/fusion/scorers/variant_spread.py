"""How far each blended token's fused and plain entries lie apart, as a selection signal.

Under variant_policy="blend" a chunk's reused KV is the mix of its fused and plain entries, and the
layout can hold each token's spread between the two (``RequestLayout.variant_spread``, from
``engine/variant_choice.entry_spread``). The more a token's KV depends on what precedes its chunk,
the further apart the two entries and the less the mix can be trusted; a token's error in the
attention output grows with that and with the weight the question gives the token. The spread is
free: the blend reads both entries anyway.

* ``weigh``: a score per reused token (the question's attention) times its spread over the mean
  spread; tokens without one (not blended: exact, plain-only, fused in their own context) weigh 1.
* ``scores``: the spread alone, no forward pass (tokens without one get the mean spread).
"""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.layout import RequestLayout, ScoringInput


def weigh(scores: torch.Tensor, layout: RequestLayout) -> torch.Tensor:
    """``scores`` (one per reused slot) times each slot's spread over the mean spread (1 where unknown)."""
    relative = _relative(layout, scores.device)
    return scores if relative is None else scores * relative


def scores(inp: ScoringInput) -> torch.Tensor:
    reused = inp.layout.reused_slots
    relative = _relative(inp.layout, reused.device)
    return torch.zeros(len(reused), device=reused.device) if relative is None else relative


def _relative(layout: RequestLayout, device: torch.device) -> torch.Tensor | None:
    """Each reused slot's spread over the mean known spread (1 where unknown); None: none known."""
    if layout.variant_spread is None:
        return None
    spread = layout.variant_spread[layout.reused_slots].to(device).float()
    known = torch.isfinite(spread)
    if not bool(known.any()):
        return None
    relative = torch.ones_like(spread)
    relative[known] = spread[known] / spread[known].mean().clamp_min(1e-12)
    return relative
