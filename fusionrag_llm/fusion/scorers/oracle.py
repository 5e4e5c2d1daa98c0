"""Oracle (analysis only): the true KV deviation from Full Attention over all layers.

It costs a full prefill, so it bounds what any cheap selector could reach.
"""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.layout import ScoringInput


def scores(inp: ScoringInput) -> torch.Tensor:
    cache, layout = inp.cache, inp.layout
    reused = layout.reused_slots
    exact = inp.model.new_cache(cache.length)
    everything = exact.reserve(cache.length)
    inp.model(layout.step(everything, logit_rows=everything[:0]), exact)
    keys = exact.keys[:, :, reused] - cache.keys[:, :, reused]  # [layers, kv_heads, n_reused, d]
    values = exact.values[:, :, reused] - cache.values[:, :, reused]
    return keys.float().pow(2).sum(dim=(0, 1, 3)) + values.float().pow(2).sum(dim=(0, 1, 3))
