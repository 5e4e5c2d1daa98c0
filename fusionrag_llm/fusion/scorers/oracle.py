"""Oracles (analysis only), each from a full prefill of the request, so they cost Full Attention's
prefill and show what a cheap selector of the same kind could reach at best:

* ``scores``: the true KV deviation from Full Attention over all layers;
* ``attention_scores``: the question's attention to each context token *under Full Attention*, over
  the upper half of the layers as ``query_guided_layers`` reads it from the stitched cache: what a
  query-guided selector would pick if its attention estimate were exact.
"""

from __future__ import annotations

import dataclasses

import torch

from fusionrag_llm.fusion.layout import ScoringInput
from fusionrag_llm.fusion.scorers import query_guided


def scores(inp: ScoringInput) -> torch.Tensor:
    cache, layout = inp.cache, inp.layout
    reused = layout.reused_slots
    exact, _, _ = _full_prefill(inp, ())
    keys = exact.keys[:, :, reused] - cache.keys[:, :, reused]  # [layers, kv_heads, n_reused, d]
    values = exact.values[:, :, reused] - cache.values[:, :, reused]
    return keys.float().pow(2).sum(dim=(0, 1, 3)) + values.float().pow(2).sum(dim=(0, 1, 3))


def attention_scores(inp: ScoringInput) -> torch.Tensor:
    exact, everything, out = _full_prefill(inp, query_guided.upper_half(inp))
    return query_guided.layers_scores_from(dataclasses.replace(inp, cache=exact), out, rows=everything)


def _full_prefill(inp: ScoringInput, query_layers: tuple[int, ...]):
    """Full Attention's cache of the request (every slot computed), its slots and the forward's output,
    keeping the queries of ``query_layers``."""
    exact = inp.model.new_cache(inp.cache.length)
    everything = exact.reserve(inp.cache.length)
    step = inp.layout.step(everything, logit_rows=everything[:0], capture_query_layers=frozenset(query_layers))
    return exact, everything, inp.model(step, exact)
