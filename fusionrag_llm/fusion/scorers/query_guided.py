"""FusionRAG: the last layer's attention from the question to each context token.

The fresh tokens (text between chunks and the suffix) run over the stitched cache; each context
token is scored by the softmax attention the suffix (question) tokens give it, summed over those
tokens and heads.

The scorer has two halves so the engine can batch it: ``scoring_pass`` is the forward it needs
(run alone by ``scores``, or with other sequences' passes in one batched forward) and
``scores_from`` reads the scores out of that forward's output.
"""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.layout import ScoringInput
from fusionrag_llm.kernels.dispatch import critical_scores
from fusionrag_llm.models.forward import ForwardOutput, ForwardPass


def scoring_pass(inp: ScoringInput) -> ForwardPass:
    """The fresh tokens over the stitched cache, keeping the last layer's queries; no logits."""
    fresh = inp.layout.fresh_slots
    return inp.layout.step(fresh, logit_rows=fresh[:0], capture_query_layers=frozenset({_last(inp)}))


def scores_from(inp: ScoringInput, out: ForwardOutput) -> torch.Tensor:
    model, cache, layout = inp.model, inp.cache, inp.layout
    last = _last(inp)
    in_suffix = torch.isin(layout.fresh_slots, layout.suffix_slots)
    queries = out.queries[last][:, in_suffix]  # [heads, n_suffix, head_dim]
    n = cache.length
    context = critical_scores(queries, layout.suffix_slots, cache.keys[last, :, :n],
                              cache.positions[:n], cache.valid[:n], backend=model.kernels)  # fmt: skip
    return context[layout.reused_slots]


def scores(inp: ScoringInput) -> torch.Tensor:
    return scores_from(inp, inp.model(scoring_pass(inp), inp.cache))


def _last(inp: ScoringInput) -> int:
    return inp.model.cfg.num_layers - 1
