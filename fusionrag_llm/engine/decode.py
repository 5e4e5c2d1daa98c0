"""Token-by-token greedy decoding over a request's KV cache."""

from __future__ import annotations

from typing import Iterator

import torch

from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM, ForwardPass


def greedy_tokens(
    model: DecoderLM,
    cache: KVCache,
    first_logits: torch.Tensor,  # [vocab] logits after the last prompt token
    next_position: int,
    max_new_tokens: int,
    stop_ids: frozenset[int],
) -> Iterator[int]:
    """Yield greedy tokens until a stop token (not yielded) or ``max_new_tokens``."""
    logits = first_logits
    for step in range(max_new_tokens):
        token = int(torch.argmax(logits))
        if token in stop_ids:
            return
        yield token
        if step + 1 == max_new_tokens:
            return
        device = cache.keys.device
        forward = ForwardPass(
            token_ids=torch.tensor([token], device=device),
            positions=torch.tensor([next_position + step], device=device),
            slots=cache.reserve(1),
        )
        logits = model(forward, cache).logits[0]
