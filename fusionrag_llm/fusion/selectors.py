"""Which reused context tokens to recompute: the selector registry and the one dispatch over it.

Every selector is a row of ``SELECTORS``; ``select_tokens`` returns ``k`` slots out of
``layout.reused_slots`` by asking the row's scorer for one score per reused token and keeping the
``k`` highest. A row without a scorer selects nothing (the method reuses every chunk token as is).

A new selection rule is one module in ``fusion/scorers/`` with ``scores(inp) -> Tensor`` and one
``SelectorSpec`` row below; methods refer to it by name (``engine/methods.py``). A scorer whose
work is one forward pass may also give its two halves (``scoring_pass``, ``scores_from``): then
``select_many`` runs the passes of several sequences as one batched forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.layout import RequestLayout, ScoringInput
from fusionrag_llm.fusion.scorers import (
    auxiliary_attention,
    cache_craft,
    chunk_starts,
    early_attention,
    kv_deviation,
    oracle,
    query_guided,
    query_guided_variants,
    random_order,
    two_stage,
    variant_spread,
)
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM, ForwardOutput, ForwardPass

Scorer = Callable[[ScoringInput], torch.Tensor]  # -> [len(layout.reused_slots)], higher = recompute first


@dataclass(frozen=True)
class SelectorSpec:
    """One selection rule as data: its name, how it scores, what it costs."""

    name: str
    scorer: Scorer | None  # None: selects nothing, whatever the ratio
    needs_forward: bool  # the scorer runs the model (it costs prefill time, counted in select_s)
    description: str
    scoring_pass: Callable[[ScoringInput], ForwardPass] | None = None  # the scorer as one forward ...
    scores_from: Callable[[ScoringInput, ForwardOutput], torch.Tensor] | None = None  # ... and its reading
    # which slots the scores choose (default: the ``k`` highest); may return fewer than ``k``
    pick: Callable[[RequestLayout, torch.Tensor, int], torch.Tensor] | None = None
    # reads ``layout.variant_spread`` (measured only for it, under variant_policy="blend")
    reads_variant_spread: bool = False

    @property
    def selects(self) -> bool:
        return self.scorer is not None


SELECTORS: dict[str, SelectorSpec] = {
    spec.name: spec
    for spec in (
        SelectorSpec("query_guided", query_guided.scores, True,
                     "FusionRAG: last-layer attention from the question to each context token",
                     query_guided.scoring_pass, query_guided.scores_from),
        SelectorSpec("query_guided_layers", query_guided.layers_scores, True,
                     "the question's attention averaged over the upper half of the layers",
                     query_guided.layers_pass, query_guided.layers_scores_from),
        SelectorSpec("query_guided_spread", query_guided_variants.spread_scores, True,
                     "the question's attention over the upper layers times how far each blended token's fused and plain entries lie apart",
                     query_guided.layers_pass, query_guided_variants.spread_from, reads_variant_spread=True),
        SelectorSpec("variant_spread", variant_spread.scores, False,
                     "how far each blended token's fused and plain entries lie apart (no forward pass)",
                     reads_variant_spread=True),
        SelectorSpec("query_guided_groups", query_guided_variants.groups, True,
                     "the question's last-layer attention, recomputing whole 8-token groups (CacheClip)",
                     query_guided.scoring_pass, query_guided_variants.groups_from),
        SelectorSpec("query_guided_per_chunk", query_guided_variants.per_chunk_scores, True,
                     "the question's last-layer attention, the same share of every chunk",
                     query_guided.scoring_pass, query_guided_variants.per_chunk_from),
        SelectorSpec("query_guided_two_stage", two_stage.scores, True,
                     "half the budget by the question's attention (upper layers), recomputed; the other half by its attention read again after that (ProphetKV's two stages)"),
        SelectorSpec("query_guided_kv_union", query_guided_variants.kv_union, True,
                     "half the tokens by the question's attention, half by CacheBlend's KV deviation"),
        SelectorSpec("kv_deviation", kv_deviation.scores, True,
                     "CacheBlend: drift of layer-1 K/V from the reused ones after recomputing layer 0"),
        SelectorSpec("early_attention", early_attention.scores, True,
                     "A3: layer 0 over every token, then the question's layer-1 attention to each context token"),
        SelectorSpec("auxiliary_attention", auxiliary_attention.scores, True,
                     "CacheClip: a shallower model's last-layer question attention, chunk by chunk, kept in 8-token windows",
                     pick=auxiliary_attention.pick),
        SelectorSpec("cache_craft", cache_craft.scores, False,
                     "Cache-Craft: per chunk, as many tokens as its Cache Fix Overhead asks, those most attentive to earlier chunks",
                     pick=cache_craft.pick),
        SelectorSpec("chunk_starts", chunk_starts.scores, False,
                     "EPIC: the first tokens of every chunk, the same number in each (no forward pass)"),
        SelectorSpec("random", random_order.scores, False, "a seeded random subset (a floor for the others)"),
        SelectorSpec("oracle", oracle.scores, True,
                     "true KV deviation from Full Attention over all layers (analysis only: a full prefill)"),
        SelectorSpec("oracle_attention", oracle.attention_scores, True,
                     "the question's attention under Full Attention, upper half of the layers (analysis only: a full prefill)"),
        SelectorSpec("none", None, False, "recompute no reused token (the ratio is ignored)"),
    )
}  # fmt: skip


def selector_spec(name: str) -> SelectorSpec:
    """The registry row of ``name``; an unknown name is an error listing the valid ones."""
    spec = SELECTORS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise FusionRAGError(f"unknown selector {name!r}; valid selectors: {', '.join(SELECTORS)}")
    return spec


def select_tokens(selector: str, k: int, model: DecoderLM, cache: KVCache, layout: RequestLayout, seed: int = 0,
                  auxiliary_layers: int | None = None, auxiliary_model: DecoderLM | None = None) -> torch.Tensor:  # fmt: skip
    """Slots of the ``k`` reused tokens to recompute (at most ``k``: a ``pick`` may drop some), ascending."""
    spec = selector_spec(selector)
    trivial = _trivial(spec, k, layout)
    if trivial is not None:
        return trivial
    _settle_unless_forward(spec, cache)
    inp = ScoringInput(model, cache, layout, seed, auxiliary_layers, k, auxiliary_model)
    return _pick(spec, layout, spec.scorer(inp), k)


@dataclass(frozen=True)
class Selection:
    """One sequence's ``select_tokens`` arguments, for ``select_many``."""

    selector: str
    k: int
    cache: KVCache
    layout: RequestLayout
    seed: int = 0
    auxiliary_layers: int | None = None
    auxiliary_model: DecoderLM | None = None


def select_many(jobs: Sequence[Selection], model: DecoderLM) -> list[torch.Tensor | Exception]:
    """``select_tokens`` for several sequences: the scorers that are one forward pass run as one
    batched forward (``model.forward_batch``), the others one by one. A job that fails gets its
    exception in its place (a failed batched forward fails every job in it)."""
    results: list[torch.Tensor | Exception | None] = [None] * len(jobs)
    batched: list[tuple[int, SelectorSpec, ScoringInput]] = []
    for i, job in enumerate(jobs):
        try:
            spec = selector_spec(job.selector)
            trivial = _trivial(spec, job.k, job.layout)
            inp = ScoringInput(model, job.cache, job.layout, job.seed, job.auxiliary_layers, job.k, job.auxiliary_model)
            if trivial is not None:
                results[i] = trivial
            elif spec.scoring_pass is None:
                _settle_unless_forward(spec, job.cache)
                results[i] = _pick(spec, job.layout, spec.scorer(inp), job.k)
            else:
                batched.append((i, spec, inp))
        except Exception as exc:  # one bad sequence fails alone
            results[i] = exc
    if batched:
        try:
            passes = [spec.scoring_pass(inp) for _, spec, inp in batched]
            outputs = model.forward_batch(passes, [inp.cache for _, _, inp in batched])
            for (i, spec, inp), out in zip(batched, outputs):
                results[i] = _pick(spec, inp.layout, spec.scores_from(inp, out), jobs[i].k)
        except Exception as exc:
            for i, _, _ in batched:
                results[i] = exc
    return results


def _trivial(spec: SelectorSpec, k: int, layout: RequestLayout) -> torch.Tensor | None:
    """The answer when no scoring is needed: nothing (k <= 0, a selector that selects nothing) or
    every reused token (k covers them all); None when the scorer must run."""
    reused = layout.reused_slots
    if k <= 0 or not spec.selects:
        return reused[:0]
    return reused if k >= len(reused) else None


def _settle_unless_forward(spec: SelectorSpec, cache: KVCache) -> None:
    """A scorer that is one forward reads the cache only layer by layer inside it (``KVCache.ready``);
    one that reads the cache otherwise (CacheBlend's layer-1 K/V, CacheClip's prefix copy) waits
    for every layer of a cache still being loaded (``fusion/layer_feed.py``). Scorers that run no
    forward read no KV."""
    if spec.scoring_pass is None and spec.needs_forward:
        cache.settle()


def _pick(spec: SelectorSpec, layout: RequestLayout, scores: torch.Tensor, k: int) -> torch.Tensor:
    return (spec.pick or _top)(layout, scores, k)


def _top(layout: RequestLayout, scores: torch.Tensor, k: int) -> torch.Tensor:
    reused = layout.reused_slots
    return reused[torch.topk(scores, k).indices].sort().values


__all__ = ["RequestLayout", "SELECTORS", "Scorer", "ScoringInput", "Selection", "SelectorSpec", "select_many",
           "select_tokens", "selector_spec"]
