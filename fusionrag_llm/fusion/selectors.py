"""Which reused context tokens to recompute.

Every selector returns ``k`` slots out of ``layout.reused_slots``:

* ``query_guided`` (FusionRAG): run the fresh tokens (text and suffix) over the stitched cache and
  score each context token by the last layer's softmax attention from the suffix (question) tokens,
  summed over those tokens and heads.
* ``kv_deviation`` (CacheBlend): recompute layer 0 for all tokens and rank by how far the layer-1
  keys and values drift from the reused ones.
* ``random``: a seeded random subset (a floor for the others).
* ``oracle``: rank by the true KV deviation from Full Attention over all layers (analysis only; it
  costs a full prefill).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fusionrag_llm.kernels.dispatch import critical_scores
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM, ForwardPass


@dataclass
class RequestLayout:
    """Where each prompt token sits in the request cache (slot == position for prompt tokens)."""

    token_ids: torch.Tensor  # [N] prompt ids
    reused_slots: torch.Tensor  # chunk tokens served from entries
    fresh_slots: torch.Tensor  # text between chunks and the suffix: always computed
    suffix_slots: torch.Tensor  # the question and template tail (a subset of fresh_slots)

    def step(self, slots: torch.Tensor, **kw) -> ForwardPass:
        return ForwardPass(token_ids=self.token_ids[slots], positions=slots, slots=slots, **kw)


def select_tokens(selector: str, k: int, model: DecoderLM, cache: KVCache, layout: RequestLayout, seed: int = 0) -> torch.Tensor:
    """Slots of the ``k`` reused tokens to recompute, ascending."""
    reused = layout.reused_slots
    if k <= 0 or selector == "none":
        return reused[:0]
    if k >= len(reused):
        return reused
    if selector == "random":
        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(reused), generator=generator).to(reused.device)
        return reused[order[:k]].sort().values
    scores = SCORERS[selector](model, cache, layout)  # [len(reused)]
    return reused[torch.topk(scores, k).indices].sort().values


def query_guided_scores(model: DecoderLM, cache: KVCache, layout: RequestLayout) -> torch.Tensor:
    last = model.cfg.num_layers - 1
    fresh = layout.fresh_slots
    out = model(layout.step(fresh, logit_rows=fresh[:0], capture_query_layers=frozenset({last})), cache)
    in_suffix = torch.isin(fresh, layout.suffix_slots)
    queries = out.queries[last][:, in_suffix]  # [heads, n_suffix, head_dim]
    n = cache.length
    scores = critical_scores(queries, layout.suffix_slots, cache.keys[last, :, :n],
                             cache.positions[:n], cache.valid[:n], backend=model.kernels)  # fmt: skip
    return scores[layout.reused_slots]


def kv_deviation_scores(model: DecoderLM, cache: KVCache, layout: RequestLayout) -> torch.Tensor:
    reused = layout.reused_slots
    cached_k = cache.keys[1, :, reused].clone()  # [kv_heads, n_reused, d], before layer 0 rewrites
    cached_v = cache.values[1, :, reused].clone()
    everything = torch.arange(cache.length, device=reused.device)
    keys, values = model.project_layer_kv(layout.step(everything), cache, layer=1)
    return _squared_distance(keys[:, reused], cached_k) + _squared_distance(values[:, reused], cached_v)


def oracle_scores(model: DecoderLM, cache: KVCache, layout: RequestLayout) -> torch.Tensor:
    reused = layout.reused_slots
    exact = model.new_cache(cache.length)
    everything = exact.reserve(cache.length)
    model(layout.step(everything, logit_rows=everything[:0]), exact)
    keys = exact.keys[:, :, reused] - cache.keys[:, :, reused]  # [layers, kv_heads, n_reused, d]
    values = exact.values[:, :, reused] - cache.values[:, :, reused]
    return keys.float().pow(2).sum(dim=(0, 1, 3)) + values.float().pow(2).sum(dim=(0, 1, 3))


def _squared_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() - b.float()).pow(2).sum(dim=(0, 2))


SCORERS = {"query_guided": query_guided_scores, "kv_deviation": kv_deviation_scores, "oracle": oracle_scores}
