"""FusionRAG as this project runs it by default (measured better than the paper on held-out questions).

* KV: each chunk's fused and plain entries blended half and half (a chunk whose neighbours all sit
  ahead of it, in the order it was fused after, keeps its fused entry alone);
* selection: the question's attention averaged over the upper half of the layers
  (``fusion/scorers/query_guided.py``);
* KV shift: from the upper half of the layers up, the tokens a chunk keeps reused move by ``kv_shift``
  of the mean K/V change of its recomputed tokens (``fusion/kv_shift.py``; 0 turns it off).
"""

from __future__ import annotations

from dataclasses import dataclass

from fusionrag_llm.fusion.kv_shift import ChunkShift
from fusionrag_llm.fusion.scorers import query_guided
from fusionrag_llm.methods.base import Method, MethodRun, Prefill, check_fraction


@dataclass(frozen=True)
class FusionRAGBlend(Method):
    name = "fusionrag"
    description = ("each chunk's fused and plain KV blended, recompute the tokens the question attends to most over "
                   "the upper layers; the rest of each chunk moved by half its recomputed tokens' mean K/V change")
    chunk_kv = "blend"
    kv_shift: float = 0.5

    def __post_init__(self) -> None:
        check_fraction("kv_shift", self.kv_shift)

    def scoring_pass(self, inp):
        return query_guided.layers_pass(inp)

    def scores_from(self, inp, out):
        return query_guided.layers_scores_from(inp, out)

    def scores(self, inp):
        return query_guided.layers_scores(inp)

    def start(self, prefill: Prefill) -> MethodRun:
        run = MethodRun()
        if self.kv_shift and not prefill.exact and len(prefill.selected):
            shift = ChunkShift(prefill.model, prefill.layout, prefill.cache.positions, prefill.recompute,
                               prefill.selected, self.kv_shift, prefill.model.cfg.num_layers // 2)  # fmt: skip
            run.hooks = (shift,) if shift.active else ()
        return run
