"""APE: plain chunk KV, every chunk at the positions right after the prefix (as if encoded alone), and
the computed tokens' attention to the chunks sharpened by a temperature and scaled as a whole.
Nothing is recomputed. Defaults as APE's comparisons report them (temperature 0.9, scale 0.9)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fusionrag_llm.methods.base import AttentionScaling, Method, MethodRun, Prefill


@dataclass(frozen=True)
class APE(Method):
    name = "ape"
    description = "plain KV, every chunk at the positions right after the prefix, attention to chunks sharpened and scaled (APE)"
    default_ratio = 0.0
    parallel_positions = True
    attention_scaling = (0.9, 0.9)

    def start(self, prefill: Prefill) -> MethodRun:
        """Every step of the request sees the chunk slots with rescaled attention."""
        cache = prefill.cache
        chunks = torch.zeros(cache.capacity, dtype=torch.bool, device=cache.keys.device)
        for start, end in prefill.layout.chunk_spans:
            chunks[start:end] = True
        run = MethodRun()
        run.scaling = AttentionScaling(chunks, *self.attention_scaling)
        return run
