"""Spreading what the sparse prefill learns about a chunk to the chunk's other tokens (``kv_shift``).

A reused chunk's KV was computed after other text than this prompt puts before it. The sparse
prefill recomputes some of its tokens over this prompt; at each layer, the change in their K/V
(new minus reused) measures how this prompt's context moves that chunk's KV there. Part of that
change is shared by the whole chunk (its tokens read the same text before it), so the tokens left
reused get ``share`` times the mean change of their chunk's recomputed tokens, at every layer from
``from_layer`` up, before the layer's attention reads the cache.

Keys are compared without their rotary rotation (each token sits at its own position) and the mean
change is rotated to each token's position before it is added. A chunk none of whose tokens is
recomputed keeps its reused KV. Nothing changes at r = 0 (nothing recomputed) or r = 1 (nothing
left reused).
"""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.layout import RequestLayout
from fusionrag_llm.fusion.scorers.shaping import chunk_of
from fusionrag_llm.models.forward import LayerHook
from fusionrag_llm.models.kv_cache import KVCache


class ChunkShift(LayerHook):
    """A ``LayerHook`` of one request's sparse prefill over ``recompute`` (sorted slots).

    ``before_write(layer, cache, keys, values)`` gets the step's new rotated keys and values
    ``[kv_heads, len(recompute), head_dim]`` once the layer's stored KV is in the cache and before
    they are written there: it reads the recomputed tokens' reused K/V, then shifts the others.
    """

    def __init__(self, model, layout: RequestLayout, positions: torch.Tensor, recompute: torch.Tensor,
                 selected: torch.Tensor, share: float, from_layer: int) -> None:  # fmt: skip
        self.model, self.share, self.from_layer = model, float(share), int(from_layer)
        device = recompute.device
        reused = layout.reused_slots.to(device)  # sorted, and holding every selected slot
        chunk = chunk_of(layout).to(device)  # every reused slot lies in one chunk
        self.picked = selected.to(device).sort().values
        self.picked_chunk = chunk[torch.searchsorted(reused, self.picked)]
        self.picked_rows = torch.searchsorted(recompute, self.picked)  # their rows in the step
        counts = torch.zeros(max(len(layout.chunk_spans), 1), device=device).index_add_(
            0, self.picked_chunk, torch.ones(len(self.picked), device=device))
        # every reused slot is moved, by weight 1 where its chunk had tokens recomputed and it was not one
        # of them, else 0 (the same numbers as moving only those, with no mask turned into a shape: no
        # device read)
        self.reused, self.reused_chunk = reused, chunk
        self.weight = (~torch.isin(reused, self.picked) & (counts[chunk] > 0)).float()
        self.picked_positions, self.reused_positions = positions[self.picked], positions[self.reused]
        # the rotary tables of both sets, once for every layer (the Triton rotary kernel makes its own)
        torch_rotary = getattr(model, "kernels", "torch") != "triton"
        self.unrotate = model.rotary_cos_sin(-self.picked_positions) if torch_rotary else None
        self.rerotate = model.rotary_cos_sin(self.reused_positions) if torch_rotary else None
        self.counts = counts.clamp(min=1)

    @property
    def active(self) -> bool:
        """Whether any reused token may be shifted (else the prefill need not call it)."""
        return (self.share > 0 and 0 < len(self.picked) < len(self.reused)
                and self.from_layer < self.model.cfg.num_layers)  # fmt: skip

    writes_kv = True

    def before_write(self, layer: int, cache: KVCache, keys: torch.Tensor, values: torch.Tensor) -> None:
        if layer < self.from_layer:
            return
        rows = self.picked_rows
        weight = self.weight[None, :, None]
        shift_v = self._chunk_mean((values[:, rows] - cache.values[layer][:, self.picked]).float())
        cache.values[layer][:, self.reused] += self.share * (shift_v[:, self.reused_chunk] * weight).to(cache.values.dtype)
        # rotation is linear: un-rotate the change itself, rotate each chunk's mean to each token's position
        change = keys[:, rows] - cache.keys[layer][:, self.picked]
        change = self.model.rotate(change, -self.picked_positions, self.unrotate).float()
        moved = self._chunk_mean(change)[:, self.reused_chunk].to(cache.keys.dtype)
        moved = self.model.rotate(moved, self.reused_positions, self.rerotate) * weight.to(cache.keys.dtype)
        cache.keys[layer][:, self.reused] += self.share * moved

    def _chunk_mean(self, change: torch.Tensor) -> torch.Tensor:
        """[kv_heads, picked, d] -> the mean over each chunk's picked tokens, [kv_heads, chunks, d]."""
        heads, _, dim = change.shape
        total = torch.zeros(heads, len(self.counts), dim, device=change.device)
        return total.index_add_(1, self.picked_chunk, change) / self.counts.view(1, -1, 1)
