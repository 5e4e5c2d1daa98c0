"""Where each prompt token of a request sits in its cache, and what every selector is given."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM, ForwardPass


@dataclass
class RequestLayout:
    """Where each prompt token sits in the request cache (slot == position unless ``positions`` says otherwise)."""

    token_ids: torch.Tensor  # [N] prompt ids
    reused_slots: torch.Tensor  # chunk tokens served from entries
    fresh_slots: torch.Tensor  # text between chunks and the suffix: always computed
    suffix_slots: torch.Tensor  # the question and template tail (a subset of fresh_slots)
    chunk_spans: tuple[tuple[int, int], ...] = ()  # [start, end) positions of every chunk, in prompt order
    missed_slots: torch.Tensor | None = None  # reused chunk tokens whose entry this request computed (a miss)
    prefix_length: int = 0  # slots [0, prefix_length) hold segment 0 (the shared prefix S0 when canonical)
    positions: torch.Tensor | None = None  # [N] each prompt slot's position; None: slot == position
    # chunk_kv="cfo" (Cache-Craft), per chunk of ``chunk_spans``: the Cache Fix Overhead of the
    # variant serving it (0 for exact KV) and its tokens' order, most contextualised first (() = unknown)
    chunk_fix: tuple[float, ...] = ()
    chunk_order: tuple[tuple[int, ...], ...] = ()

    def step(self, slots: torch.Tensor, **kw) -> ForwardPass:
        positions = slots if self.positions is None else self.positions[slots]
        return ForwardPass(token_ids=self.token_ids[slots], positions=positions, slots=slots, **kw)


@dataclass(frozen=True)
class ScoringInput:
    """Everything a scorer may read; one object, so a new scorer needs no new parameters elsewhere."""

    model: DecoderLM
    cache: KVCache  # the assembled request cache (reused chunk KV in place)
    layout: RequestLayout
    auxiliary_layers: int | None = None  # CacheClip's auxiliary model: this many layers of the main one
    k: int | None = None  # how many tokens the run will recompute (a scorer that works in stages reads it)
    auxiliary_model: DecoderLM | None = None  # CacheClip's auxiliary model when it is a separate one
