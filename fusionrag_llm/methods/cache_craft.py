"""Cache-Craft: per chunk, the variant (fused, plain, or one an earlier request made) with the lowest
Cache Fix Overhead given the chunks in front of it; per chunk as many tokens as that overhead asks,
those most attentive to earlier chunks (``fusion/scorers/cache_craft.py``); chunks the question does not
focus on stop being recomputed once that set is stable (``fusion/craft.FocusTracker``).

Fused entries carry the notes it reads when ingested with ``add_chunks(..., variant_notes=True)``.
With ``EngineOptions(craft_variants=M)`` a request that serves a chunk after chunks none of its
variants was made after stores the chunk's KV as it computed it (``fusion/request_variants.py``).
``stats.method_stats``: ``stop_layer``, ``focused_chunks``, ``stopped_tokens``, ``variants_made``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fusionrag_llm.fusion.craft import FocusTracker
from fusionrag_llm.fusion.scorers import cache_craft
from fusionrag_llm.methods.base import Method, MethodRun, Prefill
from fusionrag_llm.models.kv_cache import KVCache


@dataclass(frozen=True)
class CacheCraft(Method):
    name = "cache_craft"
    description = ("the variant (fused or plain) with the lowest Cache Fix Overhead, its most contextualised tokens "
                   "recomputed per chunk, unfocused chunks stopped early (Cache-Craft)")
    chunk_kv = "cfo"
    offline_notes = True

    def scores(self, inp):
        return cache_craft.scores(inp)

    def pick(self, layout, scores, k):
        return cache_craft.pick(layout, scores, k)

    def start(self, prefill: Prefill) -> MethodRun:
        return _CraftRun(prefill)


class _CraftRun(MethodRun):
    def __init__(self, prefill: Prefill):
        self.tracker = None
        if not prefill.exact:
            layout, recompute = prefill.layout, prefill.recompute
            droppable = torch.isin(recompute, prefill.selected)
            self.tracker = FocusTracker(recompute, layout.suffix_slots, layout.chunk_spans, droppable,
                                        prefill.model.kernels)  # fmt: skip
        self.recorder = prefill.resolver.variant_recorder(prefill.resolved) if prefill.resolver is not None else None
        self.hooks = tuple(hook for hook in (self.tracker, self.recorder) if hook is not None)

    def after_prefill(self, prefill: Prefill) -> KVCache | None:
        stats = prefill.stats
        if self.recorder is not None:
            stats["variants_made"] = prefill.resolver.store_request_variants(prefill.resolved, prefill.cache,
                                                                             self.recorder)  # fmt: skip
        if self.tracker is not None:
            focused = self.tracker.focused
            stats.update(stop_layer=self.tracker.cutoff, stopped_tokens=self.tracker.dropped,
                         focused_chunks=None if focused is None else len(focused))  # fmt: skip
        return None
