"""Decode KV eviction after the prefill (A3's extension, by SnapKV's rule), per layer and kv-head.

After the prompt's first token, each (layer, kv-head) keeps:

* every prompt token outside the retrieved chunks (system prompt, text between chunks, question and
  template tail): A3 keeps these whole, outside the budget, since they are exact and short;
* the observation window, the last ``window`` prompt tokens (SnapKV);
* of the chunk tokens, the ``budget`` ones with the highest score, where a token's score is the
  attention it gets from the window's queries at that layer (softmax over every prompt key, summed
  over the window's queries, averaged over the query heads sharing the kv-head), pooled over
  ``kernel`` neighbouring prompt positions (``max`` or ``avg``) so that neighbours of a strong token
  are kept with it.

Every head keeps the same number of tokens, so the compacted cache stays ``[layers, kv_heads,
kept, head_dim]`` with a different token set per head (``KVCache.compact``). A3 gives no constants
for the window, the pooling or the budget: the window and kernel below are the values SnapKV's
public setup uses (window 32, kernel 7, max pooling); the budget has no default.

    >>> DecodeEviction(64)
    DecodeEviction(budget=64, window=32, kernel=7, pooling='max')
    >>> decode_eviction(None) is None, decode_eviction(8).budget
    (True, 8)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.models.forward import LayerHook
from fusionrag_llm.models.kv_cache import KVCache

POOLINGS = ("max", "avg")
DEFAULT_WINDOW = 32
DEFAULT_KERNEL = 7


@dataclass(frozen=True)
class DecodeEviction:
    """How many chunk tokens each (layer, kv-head) keeps for decoding, and how they are scored."""

    budget: int  # chunk tokens kept per (layer, kv-head), beyond the protected text and the window
    window: int = DEFAULT_WINDOW  # last prompt tokens whose queries score the others (kept whole)
    kernel: int = DEFAULT_KERNEL  # odd pooling width over neighbouring positions (1: no pooling)
    pooling: str = "max"  # one of POOLINGS

    def __post_init__(self) -> None:
        for name, low in (("budget", 1), ("window", 1), ("kernel", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise FusionRAGError(f"decode KV eviction {name} must be an int >= {low}, got {value!r}")
        if self.kernel % 2 == 0:
            raise FusionRAGError(f"decode KV eviction kernel must be odd (centred on the token), got {self.kernel}")
        if self.pooling not in POOLINGS:
            raise FusionRAGError(f"decode KV eviction pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")


def decode_eviction(value) -> DecodeEviction | None:
    """The ``decode_kv_budget`` run option as settings: None (off), an int budget, or ``DecodeEviction``."""
    if value is None or isinstance(value, DecodeEviction):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise FusionRAGError(f"decode_kv_budget must be None (no eviction), an int >= 1 (chunk tokens kept per "
                             f"layer and kv-head) or a DecodeEviction, got {value!r}")  # fmt: skip
    return DecodeEviction(value)


class WindowScores(LayerHook):
    """A ``LayerHook`` of the prefill: at every layer, once its K/V are in the
    cache: records, per kv-head, the attention each slot gets from the window's queries."""

    def __init__(self, window_start: int, num_layers: int):
        self.window_start = window_start  # the window: the step's tokens at positions >= this
        self.scores: list[torch.Tensor | None] = [None] * num_layers  # per layer [kv_heads, length] float32

    def after_write(self, layer: int, q: torch.Tensor, cache: KVCache, step) -> None:
        rows = torch.nonzero(step.positions >= self.window_start).flatten()
        self.scores[layer] = window_attention(q[:, rows], cache, layer, step.positions[rows])


def window_attention(q: torch.Tensor, cache: KVCache, layer: int, positions: torch.Tensor) -> torch.Tensor:
    """[kv_heads, length]: softmax attention of the queries ``q`` [heads, w, d] at ``positions`` over the
    cache's slots at ``layer``, summed over the w queries, averaged over the heads of each kv-head."""
    n, kv_heads = cache.length, cache.keys.shape[1]
    keys = cache.keys[layer, :, :n].float()  # [kv_heads, n, d]
    grouped = q.float().reshape(kv_heads, q.shape[0] // kv_heads, q.shape[1], q.shape[2])
    logits = torch.einsum("hgwd,hnd->hgwn", grouped, keys) / q.shape[2] ** 0.5
    logits = logits.masked_fill(~cache.attention_mask(positions), float("-inf"))
    return torch.softmax(logits, dim=-1).sum(dim=2).mean(dim=1)


def keep_index(scores: torch.Tensor, candidates: torch.Tensor, valid: torch.Tensor,
               settings: DecodeEviction) -> torch.Tensor | None:  # fmt: skip
    """Sorted slots each (layer, kv-head) keeps, ``[layers, kv_heads, protected + budget]``; None when
    the budget holds every candidate (nothing to evict).

    ``scores`` [layers, kv_heads, length] (``WindowScores``); ``candidates`` [length] bool: the slots
    that may be evicted (chunk tokens outside the window); ``valid`` [length]: slots holding a token.
    """
    candidates = candidates & valid
    count = int(candidates.sum())
    if settings.budget >= count:
        return None
    layers, heads, length = scores.shape
    flat = (scores * candidates).reshape(layers * heads, 1, length)
    pad = settings.kernel // 2
    if settings.pooling == "max":
        pooled = F.max_pool1d(flat, settings.kernel, stride=1, padding=pad)
    else:
        pooled = F.avg_pool1d(flat, settings.kernel, stride=1, padding=pad)
    pooled = pooled.reshape(layers, heads, length).masked_fill(~candidates, float("-inf"))
    chosen = pooled.topk(settings.budget, dim=-1).indices
    protected = torch.nonzero(valid & ~candidates).flatten().expand(layers, heads, -1)
    return torch.cat([protected, chosen], dim=-1).sort(dim=-1).values


__all__ = ["DEFAULT_KERNEL", "DEFAULT_WINDOW", "POOLINGS", "DecodeEviction", "WindowScores", "decode_eviction", "keep_index",
           "window_attention"]  # fmt: skip
