"""The question's attention (``query_guided``) with the top ``k`` chosen by another rule (``shaping``):
whole 8-token groups (CacheClip), the same share of every chunk, or a union with CacheBlend's KV
deviation ranking. The first two read the same forward as ``query_guided`` and batch like it.

``spread_scores`` weighs the upper layers' attention (``query_guided.layers_scores``) by each blended
token's fused/plain spread (``scorers/variant_spread.py``)."""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.layout import ScoringInput
from fusionrag_llm.fusion.scorers import kv_deviation, query_guided, variant_spread
from fusionrag_llm.fusion.scorers.shaping import in_groups, per_chunk, rank_union
from fusionrag_llm.models.forward import ForwardOutput


def groups_from(inp: ScoringInput, out: ForwardOutput) -> torch.Tensor:
    return in_groups(query_guided.scores_from(inp, out), inp.layout)


def groups(inp: ScoringInput) -> torch.Tensor:
    return in_groups(query_guided.scores(inp), inp.layout)


def per_chunk_from(inp: ScoringInput, out: ForwardOutput) -> torch.Tensor:
    return per_chunk(query_guided.scores_from(inp, out), inp.layout)


def per_chunk_scores(inp: ScoringInput) -> torch.Tensor:
    return per_chunk(query_guided.scores(inp), inp.layout)


def kv_union(inp: ScoringInput) -> torch.Tensor:
    # the question's pass first: CacheBlend's check recomputes layer 0 of every token in the cache
    attention = query_guided.scores(inp)
    return rank_union(attention, kv_deviation.scores(inp))


def spread_from(inp: ScoringInput, out: ForwardOutput) -> torch.Tensor:
    return variant_spread.weigh(query_guided.layers_scores_from(inp, out), inp.layout)


def spread_scores(inp: ScoringInput) -> torch.Tensor:
    return variant_spread.weigh(query_guided.layers_scores(inp), inp.layout)
