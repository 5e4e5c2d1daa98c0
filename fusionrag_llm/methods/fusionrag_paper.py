"""FusionRAG as published: fused chunk KV; recompute the tokens the question attends to most at the
last layer (``fusion/scorers/query_guided.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from fusionrag_llm.fusion.scorers import query_guided
from fusionrag_llm.methods.base import Method


@dataclass(frozen=True)
class FusionRAGPaper(Method):
    name = "fusionrag_paper"
    description = "fused KV, recompute the tokens the question attends to most at the last layer (the paper)"
    chunk_kv = "fused"

    def scoring_pass(self, inp):
        return query_guided.scoring_pass(inp)

    def scores_from(self, inp, out):
        return query_guided.scores_from(inp, out)

    def scores(self, inp):
        return query_guided.scores(inp)
