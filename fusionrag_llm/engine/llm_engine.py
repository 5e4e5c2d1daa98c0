"""Runs one request end to end: segments -> KV for the prompt -> first token -> decode."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from fusionrag_llm.engine.decode import greedy_tokens
from fusionrag_llm.engine.stats import GenerationStats
from fusionrag_llm.errors import FusionRAGError, PromptTooLongError
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import ForwardPass
from fusionrag_llm.models.loader import LoadedModel
from fusionrag_llm.request import Segment, prompt_ids

METHODS = ("full_attention",)


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    prompt_ids: list[int]  # exactly the ids the model saw
    stats: GenerationStats
    segments: list[Segment] = field(default_factory=list, repr=False)


@dataclass
class Prefilled:
    """A prompt's KV cache and the logits that give the first generated token."""

    cache: KVCache
    last_logits: torch.Tensor  # [vocab]
    next_position: int
    stats: GenerationStats


class LLMEngine:
    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer

    def check_method(self, method: str) -> None:
        if method not in METHODS:
            raise FusionRAGError(f"unknown method {method!r}; valid methods: {', '.join(METHODS)}")

    def check_fits(self, num_prompt_tokens: int, max_new_tokens: int) -> None:
        window = self.loaded.context_window
        if num_prompt_tokens + max_new_tokens > window:
            raise PromptTooLongError(
                f"the prompt has {num_prompt_tokens} tokens and {max_new_tokens} new tokens were asked for, "
                f"but model {self.loaded.name!r} has a context window of {window} tokens; "
                "pass fewer or shorter chunks, or lower max_new_tokens"
            )

    def prefill(self, segments: Sequence[Segment], method: str, extra_capacity: int) -> Prefilled:
        self.check_method(method)
        start = time.perf_counter()
        ids = prompt_ids(segments)
        cache = self.model.new_cache(len(ids) + extra_capacity)
        device = self.model.device
        forward = ForwardPass(
            token_ids=torch.tensor(ids, device=device),
            positions=torch.arange(len(ids), device=device),
            slots=cache.reserve(len(ids)),
            logit_rows=torch.tensor([len(ids) - 1], device=device),
        )
        logits = self.model(forward, cache).logits[0]
        elapsed = time.perf_counter() - start
        stats = GenerationStats(
            method=method, recompute_ratio=1.0, ttft_s=elapsed, prefill_s=elapsed,
            prompt_tokens=len(ids), computed_tokens=len(ids),
        )  # fmt: skip
        return Prefilled(cache=cache, last_logits=logits, next_position=len(ids), stats=stats)

    def generate(self, segments: Sequence[Segment], method: str, max_new_tokens: int) -> Generation:
        ids = prompt_ids(segments)
        if max_new_tokens < 1:
            raise FusionRAGError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.check_fits(len(ids), max_new_tokens)
        state = self.prefill(segments, method, extra_capacity=max_new_tokens)
        start = time.perf_counter()
        tokens = list(
            greedy_tokens(self.model, state.cache, state.last_logits, state.next_position,
                          max_new_tokens, self.tokenizer.stop_ids)
        )  # fmt: skip
        stats = state.stats
        stats.decode_s = time.perf_counter() - start
        stats.generated_tokens = len(tokens)
        text = self.tokenizer.decode(tokens)
        return Generation(text=text, token_ids=tokens, prompt_ids=ids, stats=stats, segments=list(segments))
