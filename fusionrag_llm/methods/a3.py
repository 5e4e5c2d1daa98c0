"""A3: plain chunk KV; layer 0 runs over every token, then the question's layer-1 attention picks the
tokens to recompute (``fusion/scorers/early_attention.py``).

``decode_kv_budget`` (default None: off) adds A3's decode KV eviction after the prefill
(``models/kv_eviction.py``): every layer and kv-head keeps the prompt text outside the chunks, the last
prompt tokens and the ``decode_kv_budget`` chunk tokens those attend to most (SnapKV's rule; a
``DecodeEviction`` sets window, kernel and pooling too). ``stats.method_stats`` then holds
``decode_kv_tokens`` and ``evicted_kv_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fusionrag_llm.fusion.scorers import early_attention
from fusionrag_llm.methods.base import Method, MethodRun, Prefill
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.kv_eviction import DecodeEviction, WindowScores, decode_eviction, keep_index


@dataclass(frozen=True)
class A3(Method):
    name = "a3"
    description = "plain KV; layer 0 for all tokens, then the tokens the question attends to most at layer 1 (A3)"
    reads_cache = True
    decode_kv_budget: int | DecodeEviction | None = None

    def __post_init__(self) -> None:
        decode_eviction(self.decode_kv_budget)  # refuses a bad budget at construction

    def scores(self, inp):
        return early_attention.scores(inp)

    def start(self, prefill: Prefill) -> MethodRun:
        settings = decode_eviction(self.decode_kv_budget)
        return MethodRun() if settings is None else _Eviction(prefill, settings)


class _Eviction(MethodRun):
    """Scores the prompt's last tokens' attention during the prefill, then compacts the cache."""

    def __init__(self, prefill: Prefill, settings: DecodeEviction):
        self.settings = settings
        recompute, n, tail = prefill.recompute, len(prefill.layout.token_ids), 0
        # the window: the last prompt tokens, fewer when not all of them run in the prefill
        while tail < min(settings.window, len(recompute)) and int(recompute[-1 - tail]) == n - 1 - tail:
            tail += 1
        self.scores = WindowScores(n - max(tail, 1), prefill.model.cfg.num_layers)
        self.hooks = (self.scores,)

    def after_prefill(self, prefill: Prefill) -> KVCache | None:
        cache, n = prefill.cache, prefill.cache.length
        candidates = torch.zeros(n, dtype=torch.bool, device=cache.keys.device)
        for start, end in prefill.layout.chunk_spans:  # chunk tokens before the window may go
            candidates[start:end] = True
        candidates[self.scores.window_start :] = False
        index = keep_index(torch.stack(self.scores.scores), candidates, cache.valid[:n], self.settings)
        kept = cache if index is None else cache.compact(index)
        prefill.stats.update(decode_kv_tokens=kept.length, evicted_kv_tokens=n - kept.length)
        return kept
