"""Which reused context tokens to recompute: the selector registry and the one dispatch over it.

Every selector is a row of ``SELECTORS``; ``select_tokens`` returns ``k`` slots out of
``layout.reused_slots`` by asking the row's scorer for one score per reused token and keeping the
``k`` highest. A row without a scorer selects nothing (the method reuses every chunk token as is).

A new selection rule is one module in ``fusion/scorers/`` with ``scores(inp) -> Tensor`` and one
``SelectorSpec`` row below; methods refer to it by name (``engine/methods.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.layout import RequestLayout, ScoringInput
from fusionrag_llm.fusion.scorers import kv_deviation, oracle, query_guided, random_order
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM

Scorer = Callable[[ScoringInput], torch.Tensor]  # -> [len(layout.reused_slots)], higher = recompute first


@dataclass(frozen=True)
class SelectorSpec:
    """One selection rule as data: its name, how it scores, what it costs."""

    name: str
    scorer: Scorer | None  # None: selects nothing, whatever the ratio
    needs_forward: bool  # the scorer runs the model (it costs prefill time, counted in select_s)
    description: str

    @property
    def selects(self) -> bool:
        return self.scorer is not None


SELECTORS: dict[str, SelectorSpec] = {
    spec.name: spec
    for spec in (
        SelectorSpec("query_guided", query_guided.scores, True,
                     "FusionRAG: last-layer attention from the question to each context token"),
        SelectorSpec("kv_deviation", kv_deviation.scores, True,
                     "CacheBlend: drift of layer-1 K/V from the reused ones after recomputing layer 0"),
        SelectorSpec("random", random_order.scores, False, "a seeded random subset (a floor for the others)"),
        SelectorSpec("oracle", oracle.scores, True,
                     "true KV deviation from Full Attention over all layers (analysis only: a full prefill)"),
        SelectorSpec("none", None, False, "recompute no reused token (the ratio is ignored)"),
    )
}  # fmt: skip


def selector_spec(name: str) -> SelectorSpec:
    """The registry row of ``name``; an unknown name is an error listing the valid ones."""
    spec = SELECTORS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise FusionRAGError(f"unknown selector {name!r}; valid selectors: {', '.join(SELECTORS)}")
    return spec


def select_tokens(selector: str, k: int, model: DecoderLM, cache: KVCache, layout: RequestLayout, seed: int = 0) -> torch.Tensor:
    """Slots of the ``k`` reused tokens to recompute, ascending."""
    spec = selector_spec(selector)
    reused = layout.reused_slots
    if k <= 0 or not spec.selects:
        return reused[:0]
    if k >= len(reused):
        return reused
    scores = spec.scorer(ScoringInput(model, cache, layout, seed))  # [len(reused)]
    return reused[torch.topk(scores, k).indices].sort().values


__all__ = ["RequestLayout", "SELECTORS", "Scorer", "ScoringInput", "SelectorSpec", "select_tokens", "selector_spec"]
