"""CacheBlend: plain chunk KV; recompute the tokens whose layer-1 K/V drift most once layer 0 has run
over the whole prompt (``fusion/scorers/kv_deviation.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from fusionrag_llm.fusion.scorers import kv_deviation
from fusionrag_llm.methods.base import Method


@dataclass(frozen=True)
class CacheBlend(Method):
    name = "cacheblend"
    description = "plain KV, recompute the tokens whose layer-1 KV drifts most"
    reads_cache = True

    def scores(self, inp):
        return kv_deviation.scores(inp)
