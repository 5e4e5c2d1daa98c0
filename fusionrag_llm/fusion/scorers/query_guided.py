"""FusionRAG: the last layer's attention from the question to each context token.

The fresh tokens (text between chunks and the suffix) run over the stitched cache; each context
token is scored by the softmax attention the suffix (question) tokens give it, summed over those
tokens and heads.
"""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.layout import ScoringInput
from fusionrag_llm.kernels.dispatch import critical_scores


def scores(inp: ScoringInput) -> torch.Tensor:
    model, cache, layout = inp.model, inp.cache, inp.layout
    last = model.cfg.num_layers - 1
    fresh = layout.fresh_slots
    out = model(layout.step(fresh, logit_rows=fresh[:0], capture_query_layers=frozenset({last})), cache)
    in_suffix = torch.isin(fresh, layout.suffix_slots)
    queries = out.queries[last][:, in_suffix]  # [heads, n_suffix, head_dim]
    n = cache.length
    context = critical_scores(queries, layout.suffix_slots, cache.keys[last, :, :n],
                              cache.positions[:n], cache.valid[:n], backend=model.kernels)  # fmt: skip
    return context[layout.reused_slots]
