"""CacheBlend: how far layer 1's keys and values drift from the reused ones.

Layer 0 is recomputed for all tokens; a token whose layer-1 K/V moves most once it sees the other
chunks is the one whose reused KV is most wrong.
"""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.layout import ScoringInput


def scores(inp: ScoringInput) -> torch.Tensor:
    cache, layout = inp.cache, inp.layout
    reused = layout.reused_slots
    cached_k = cache.keys[1, :, reused].clone()  # [kv_heads, n_reused, d], before layer 0 rewrites
    cached_v = cache.values[1, :, reused].clone()
    everything = torch.arange(cache.length, device=reused.device)
    keys, values = inp.model.project_layer_kv(layout.step(everything), cache, layer=1)
    return squared_distance(keys[:, reused], cached_k) + squared_distance(values[:, reused], cached_v)


def squared_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-token squared L2 distance of [heads, n, d] tensors, summed over heads -> [n]."""
    return (a.float() - b.float()).pow(2).sum(dim=(0, 2))
