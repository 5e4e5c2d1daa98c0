"""Per-generation measurements, returned with every answer."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationStats:
    method: str = "full_attention"
    recompute_ratio: float = 1.0
    ttft_s: float = 0.0  # admission to first token's logits (includes load, select, prefill)
    queue_s: float = 0.0  # waiting in the engine's queue before admission
    load_s: float = 0.0  # fetching and placing chunk entries
    select_s: float = 0.0  # choosing the tokens to recompute
    prefill_s: float = 0.0  # the (sparse) prefill itself
    decode_s: float = 0.0
    prompt_tokens: int = 0
    # prompt_tokens = exact_tokens + reused_tokens + recomputed_tokens + missed_tokens + fresh_tokens
    exact_tokens: int = 0  # KV placed exactly: the cached prefix, exact path blocks, an exact first chunk
    reused_tokens: int = 0  # chunk tokens served from stored entries and not recomputed
    recomputed_tokens: int = 0  # chunk tokens selected for recompute
    missed_tokens: int = 0  # chunk tokens whose entry was computed for this request (a miss), not recomputed
    fresh_tokens: int = 0  # text between chunks and the suffix, computed in the prefill
    computed_tokens: int = 0  # every token run through the model for this request (misses included)
    turn_tokens: int = 0  # prompt tokens read from an earlier request's KV (multi-turn reuse; part of exact_tokens)
    generated_tokens: int = 0
    prefetch_s: float = 0.0  # time the loader spent fetching this request's entries in the background
    wait_s: float = 0.0  # time the scheduler blocked until they were ready (load time not hidden)
    prefetched_entries: int = 0
    path_hits: dict[str, int] = field(default_factory=lambda: {"exact": 0, "chunk": 0, "miss": 0})
    tier_hits: dict[str, int] = field(default_factory=lambda: {"device": 0, "host": 0, "disk": 0})
    variant_hits: dict[str, int] = field(default_factory=lambda: {"fused": 0, "plain": 0})  # chunk hits by variant
    # retrieved chunks (registered) that a framework adapter found the prompt not to hold as registered
    # text (e.g. rewritten by a template), so they were not reused; 0 where no adapter checked
    unmatched_chunks: int = 0
    # the method's own counters (``fusionrag_llm/methods``): e.g. Cache-Craft's ``stop_layer``, A3's
    # ``evicted_kv_tokens``, the blend's ``fused_in_context``; empty for a method that keeps none
    method_stats: dict = field(default_factory=dict)

    @property
    def decode_tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def to_dict(self) -> dict:
        return asdict(self)
