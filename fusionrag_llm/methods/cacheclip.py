"""CacheClip: plain chunk KV; a shallower model's question attention picks the tokens, kept in 8-token
windows (``fusion/scorers/auxiliary_attention.py``). The auxiliary model is the engine's
(``EngineOptions.auxiliary``): by default the first quarter of the main model's layers."""

from __future__ import annotations

from dataclasses import dataclass

from fusionrag_llm.fusion.scorers import auxiliary_attention
from fusionrag_llm.methods.base import Method


@dataclass(frozen=True)
class CacheClip(Method):
    name = "cacheclip"
    description = "plain KV, recompute the tokens a shallower model's question attention picks, in 8-token windows (CacheClip)"
    reads_cache = True

    def scores(self, inp):
        return auxiliary_attention.scores(inp)

    def pick(self, layout, scores, k):
        return auxiliary_attention.pick(layout, scores, k)
