"""Runs one request: resolve chunk entries, assemble, select, sparse prefill, decode.

DESIGN.md section 4. Prompt tokens occupy slots equal to their positions; the prefix comes from the
exact prefix cache, chunks from their entries (rotary applied at their assembled positions), and the
recompute set (selected chunk tokens plus all fresh text) is run through every layer, replacing the
reused K/V of its positions layer by layer in the request's own cache. Shared entries are only read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from fusionrag_llm.engine.decode import check_token_ids, teacher_forced
from fusionrag_llm.engine.methods import METHODS, RunPlan
from fusionrag_llm.engine.stats import GenerationStats
from fusionrag_llm.engine.streaming import GenerationStream
from fusionrag_llm.errors import FusionRAGError, PromptTooLongError
from fusionrag_llm.fusion.chunk_entries import ChunkEntries
from fusionrag_llm.engine.resolve import ContextResolver, Preloaded
from fusionrag_llm.fusion.selectors import select_tokens
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.loader import LoadedModel
from fusionrag_llm.request import Segment, prompt_ids

__all__ = ["METHODS", "Generation", "LLMEngine", "Prefilled"]


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
    def __init__(self, loaded: LoadedModel, entries: ChunkEntries, prefix_cache: bool = True):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.entries = entries
        self.prefix_cache = prefix_cache

    def resolver(self, preloaded: Preloaded | None = None) -> ContextResolver:
        return ContextResolver(self.entries, preloaded, self.prefix_cache)

    def check_fits(self, num_prompt_tokens: int, max_new_tokens: int) -> None:
        window = self.loaded.context_window
        if num_prompt_tokens + max_new_tokens > window:
            raise PromptTooLongError(
                f"the prompt has {num_prompt_tokens} tokens and {max_new_tokens} new tokens were asked for, "
                f"but model {self.loaded.name!r} has a context window of {window} tokens; "
                "pass fewer or shorter chunks, or lower max_new_tokens"
            )

    def prefill(self, segments: Sequence[Segment], plan: RunPlan, extra_capacity: int,
                preloaded: Preloaded | None = None) -> Prefilled:  # fmt: skip
        start = time.perf_counter()
        ids = prompt_ids(segments)
        stats = GenerationStats(method=plan.method, recompute_ratio=plan.recompute_ratio, prompt_tokens=len(ids))
        cache = self.model.new_cache(len(ids) + extra_capacity)
        resolver = self.resolver(preloaded)
        resolved = resolver.assemble(segments, plan, cache, stats)
        layout = resolved.layout
        loaded = time.perf_counter()
        k = round(plan.recompute_ratio * len(layout.reused_slots))
        selected = select_tokens(plan.selector, k, self.model, cache, layout, plan.seed)
        chosen = time.perf_counter()
        recompute = torch.cat([selected, layout.fresh_slots]).sort().values
        exact = len(selected) == len(layout.reused_slots)  # every context token is exact after this run
        last_row = torch.tensor([len(recompute) - 1], device=recompute.device)
        out = self.model(layout.step(recompute, logit_rows=last_row, capture_raw_kv=exact), cache)
        done = time.perf_counter()
        if exact:
            resolver.store_exact_blocks(resolved, recompute, out.raw_keys, out.raw_values, ids)
        stats.load_s, stats.select_s, stats.prefill_s = loaded - start, chosen - loaded, done - chosen
        stats.ttft_s = done - start
        stats.recomputed_tokens = len(selected)
        stats.reused_tokens = len(layout.reused_slots) - len(selected)
        stats.computed_tokens += len(recompute)
        return Prefilled(cache=cache, last_logits=out.logits[0], next_position=len(ids), stats=stats)

    def stream(self, segments: Sequence[Segment], plan: RunPlan, max_new_tokens: int,
               preloaded: Preloaded | None = None) -> GenerationStream:  # fmt: skip
        """Prefill now; iterate the returned stream for text deltas."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise FusionRAGError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        ids = prompt_ids(segments)
        self.check_fits(len(ids), max_new_tokens)
        state = self.prefill(segments, plan, extra_capacity=max_new_tokens, preloaded=preloaded)
        return GenerationStream(self, state, ids, max_new_tokens)

    def generate(self, segments: Sequence[Segment], plan: RunPlan, max_new_tokens: int,
                 preloaded: Preloaded | None = None) -> Generation:  # fmt: skip
        stream = self.stream(segments, plan, max_new_tokens, preloaded)
        for _ in stream:
            pass
        return Generation(text=stream.text, token_ids=stream.token_ids, prompt_ids=stream.prompt_ids,
                          stats=stream.stats, segments=list(segments))  # fmt: skip

    def logits(self, segments: Sequence[Segment], continuation: Sequence[int], plan: RunPlan) -> torch.Tensor:
        """[len(continuation) + 1, vocab] teacher-forced logits after the prompt and each continuation token."""
        continuation = check_token_ids(continuation, self.model.cfg.vocab_size)
        ids = prompt_ids(segments)
        self.check_fits(len(ids), len(continuation))
        state = self.prefill(segments, plan, extra_capacity=len(continuation))
        return teacher_forced(self.model, state.cache, state.last_logits, state.next_position, continuation)
