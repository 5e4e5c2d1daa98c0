"""Two-stage query-guided selection, after ProphetKV's dual-stage recompute (the question's attention,
averaged over the upper half of the layers, read twice).

Stage one ranks the reused tokens by the question's attention over the stitched cache
(``query_guided.layers_scores``) and recomputes the top half of the budget together with the fresh
text, in one sparse prefill that keeps the question's queries. Those queries now see the corrected
KV of the tokens that mattered most, so the question's attention is read again from that same pass
(no extra scoring forward) and ranks the rest. The scores put stage one's picks first (in their
order), then every other token by its second reading, so the top ``k`` is both stages' picks.

What stage one writes in the request cache is overwritten by the engine's own sparse prefill, which
recomputes all ``k`` picks and the fresh text again: the result is that of the paper's pipeline with
a different selection, at the cost of one more sparse prefill of half the budget.
"""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.layout import ScoringInput
from fusionrag_llm.fusion.scorers import query_guided


def scores(inp: ScoringInput) -> torch.Tensor:
    layout, k = inp.layout, inp.k
    first = query_guided.layers_scores(inp)
    if k is None or k <= 1 or k >= len(layout.reused_slots):
        return first
    picked = torch.topk(first, (k + 1) // 2).indices
    rows = torch.cat([layout.reused_slots[picked], layout.fresh_slots]).sort().values
    out = inp.model(layout.step(rows, logit_rows=rows[:0], capture_query_layers=frozenset(query_guided.upper_half(inp))),
                    inp.cache)  # fmt: skip
    second = query_guided.layers_scores_from(inp, out, rows)
    ranked = second - second.min() + 1.0  # >= 1 everywhere
    ranked[picked] = ranked.max() + 1.0 + first[picked] / first[picked].max().clamp_min(1e-12)  # stage one first
    return ranked
