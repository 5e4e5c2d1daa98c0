"""FusionRAG: the attention from the question to each context token, and stronger variants of it.

The fresh tokens (text between chunks and the suffix) run over the stitched cache; each context
token is scored by the softmax attention the suffix (question) tokens give it, summed over those
tokens and heads. The paper reads the last layer (``scores``); ``layers_scores`` averages the upper
half of the layers, each layer's scores first divided by their sum so every layer weighs alike.

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
    return _pass(inp, (_last(inp),))


def scores_from(inp: ScoringInput, out: ForwardOutput) -> torch.Tensor:
    return _layer_scores(inp, out, _last(inp), _suffix_rows(inp))


def scores(inp: ScoringInput) -> torch.Tensor:
    return scores_from(inp, inp.model(scoring_pass(inp), inp.cache))


def layers_pass(inp: ScoringInput) -> ForwardPass:
    """As ``scoring_pass``, keeping the queries of the upper half of the layers."""
    return _pass(inp, upper_half(inp))


def layers_scores_from(inp: ScoringInput, out: ForwardOutput) -> torch.Tensor:
    rows = _suffix_rows(inp)
    per_layer = [_layer_scores(inp, out, layer, rows) for layer in upper_half(inp)]
    return torch.stack([s / s.sum().clamp_min(1e-12) for s in per_layer]).mean(dim=0)


def layers_scores(inp: ScoringInput) -> torch.Tensor:
    return layers_scores_from(inp, inp.model(layers_pass(inp), inp.cache))


def _pass(inp: ScoringInput, layers: tuple[int, ...]) -> ForwardPass:
    fresh = inp.layout.fresh_slots
    return inp.layout.step(fresh, logit_rows=fresh[:0], capture_query_layers=frozenset(layers), scattered=True)


def _suffix_rows(inp: ScoringInput) -> torch.Tensor:
    """The suffix's rows among the fresh slots (both sorted, the suffix among them): no mask, no device read."""
    return torch.searchsorted(inp.layout.fresh_slots, inp.layout.suffix_slots)


def _layer_scores(inp: ScoringInput, out: ForwardOutput, layer: int, rows: torch.Tensor) -> torch.Tensor:
    """The question's attention at ``layer`` to each reused token, from a forward whose rows were the
    fresh slots (``scoring_pass``); ``rows``: the suffix's among them (``_suffix_rows``)."""
    model, cache, layout = inp.model, inp.cache, inp.layout
    queries = out.queries[layer][:, rows]  # [heads, n_suffix, head_dim]
    n = cache.length
    context = critical_scores(queries, layout.suffix_slots, cache.keys[layer, :, :n],
                              cache.positions[:n], cache.valid[:n], backend=model.kernels)  # fmt: skip
    return context[layout.reused_slots].float()


def _last(inp: ScoringInput) -> int:
    return inp.model.cfg.num_layers - 1


def upper_half(inp: ScoringInput) -> tuple[int, ...]:
    layers = inp.model.cfg.num_layers
    return tuple(range(layers // 2, layers))
