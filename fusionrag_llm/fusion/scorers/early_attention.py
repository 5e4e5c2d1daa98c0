"""A3: the question's attention at layer 1, once layer 0 has run over every token.

Every prompt token goes through layer 0 over the stitched cache (its layer-0 KV stays, exact, as in
the paper); the question tokens' layer-1 queries then attend to every token's layer-1 keys, and a
reused token is scored by the softmax attention it gets, summed over question tokens and heads.
"""

from __future__ import annotations

import torch

from fusionrag_llm.fusion.layout import ScoringInput
from fusionrag_llm.kernels.dispatch import critical_scores

LAYER = 1  # the paper's shallow layer


def scores(inp: ScoringInput) -> torch.Tensor:
    model, cache, layout = inp.model, inp.cache, inp.layout
    n = cache.length
    everything = torch.arange(n, device=layout.reused_slots.device)  # prompt slots are positions
    layer = min(LAYER, model.cfg.num_layers - 1)
    queries, keys, _ = model.project_layer(layout.step(everything), cache, layer=layer)
    context = critical_scores(queries[:, layout.suffix_slots], layout.suffix_slots, keys, cache.positions[:n],
                              cache.valid[:n], backend=model.kernels)  # fmt: skip
    return context[layout.reused_slots].float()
