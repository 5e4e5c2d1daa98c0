"""The engine's device work: request caches, the batched forward of a step, the next tokens.

The scheduler and the sequences move integers; this is where a step's sequences become one
forward call (one sequence: ``model(step, cache)``; several: ``model.forward_batch``), where
decode inputs are built and where logits become token ids with one device sync per step.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence as Seq

import torch

from fusionrag_llm.engine.sampling import SamplingState, next_tokens
from fusionrag_llm.engine.scheduler import DEVICE_DEFAULTS, SchedulerConfig
from fusionrag_llm.engine.sequence import Sequence
from fusionrag_llm.fusion.placement import position_free_kv
from fusionrag_llm.fusion.layout import RequestLayout
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.cache_memory import CacheMemory
from fusionrag_llm.models.kv_pool import KVPools, slot_bytes
from fusionrag_llm.models.forward import AttentionScaling
from fusionrag_llm.models.llama import DecoderLM, ForwardOutput, ForwardPass

KV_MEMORY_SHARE = 0.5  # of a GPU's free memory when the engine starts: the request caches' slots


def kv_budget(free_bytes: int, per_slot: int, most: int) -> int:
    """Cache slots for request caches on a GPU with ``free_bytes`` free, ``per_slot`` bytes each: a share
    of the memory, but never more than ``most`` (what the scheduler could ever admit)."""
    return max(1, min(int(free_bytes * KV_MEMORY_SHARE) // per_slot, most))


class ModelRunner:
    def __init__(self, model: DecoderLM):
        self.model = model
        self.defaults = self._scheduler_defaults()
        # request caches from shared buffers (``models/kv_pool.py``), so a decode step of many sequences
        # is one attention call per layer: on CUDA with the Triton backend, whose kernel reads them
        self.pools = KVPools.of(model) if model.device.type == "cuda" and model.kernels == "triton" else None
        # on the CPU, dense caches in memory earlier caches used (``models/cache_memory.py``): fresh memory
        # that large costs a page fault per 4 KiB when first zeroed
        self.memory = CacheMemory() if model.device.type == "cpu" else None

    def _scheduler_defaults(self) -> SchedulerConfig:
        """What the scheduler's None limits mean on this model's device: on a GPU, cache slots for
        ``KV_MEMORY_SHARE`` of the memory free now (after the weights), or for as many sequences as it
        decodes together, each of the whole context window, if that is less (a small model)."""
        device = self.model.device
        if device.type != "cuda":
            return DEVICE_DEFAULTS["cpu"]
        free, cfg, defaults = torch.cuda.mem_get_info(device)[0], self.model.cfg, DEVICE_DEFAULTS["cuda"]
        per_slot = slot_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, self.model.dtype)
        slots = kv_budget(free, per_slot, defaults.max_num_seqs * cfg.max_position_embeddings)
        return dataclasses.replace(defaults, max_kv_tokens=slots)

    def new_cache(self, capacity: int, pool_slots: int | None = None) -> KVCache:
        """A request's cache: from a pool where there are pools and one has room, else a dense one (on the
        CPU in memory an earlier cache used, ``models/cache_memory.py``).
        ``pool_slots``: the slots of the first pool if it is made now (the scheduler's ``max_kv_tokens``,
        so every sequence it admits fits in one pool)."""
        model = self.model
        if self.pools is not None and (self.pools.dtype, self.pools.device) != (model.dtype, model.device):
            self.pools = KVPools.of(model)  # the model was moved or cast since
        cache = self.pools.new_cache(capacity, pool_slots) if self.pools is not None else None
        if self.memory is not None and model.device.type != "cpu":
            self.memory = None  # the model was moved off the CPU: let the buffers go
        if cache is None and self.memory is not None:
            cfg = model.cfg
            cache = self.memory.new_cache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, capacity, model.dtype,
                                          model.device)  # fmt: skip
        return cache if cache is not None else model.new_cache(capacity)

    def fork_cache(self, cache: KVCache) -> KVCache:
        """An independent copy of ``cache`` (answers 2..n of a request): in a pool where there are pools, so
        the answers' decode steps share the pooled write and attention call, else a dense one."""
        twin = self.pools.new_cache(cache.capacity) if self.pools is not None else None
        return cache.fork(into=twin)

    def pooled(self, cache: KVCache) -> KVCache:
        """``cache`` moved into a pool where there are pools and it is in none (a cache a method made after
        the prefill, e.g. A3's smaller one), so its decode steps join the pooled call; else ``cache``."""
        twin = self.pools.new_cache(cache.capacity) if self.pools is not None and cache.pool is None else None
        return cache if twin is None else cache.fork(into=twin)

    def recompute_pass(self, layout: RequestLayout, recompute: torch.Tensor, capture_raw_kv: bool,
                       hooks: tuple = (), scaling: AttentionScaling | None = None, exact: bool = False) -> ForwardPass:  # fmt: skip
        """The sparse prefill: the recompute set (sorted slots), logits of the last prompt token only. Unless
        ``exact`` (every context token recomputed: a causal block, which attention finds), it is scattered."""
        last_row = torch.tensor([len(recompute) - 1], device=recompute.device)
        return layout.step(recompute, logit_rows=last_row, capture_raw_kv=capture_raw_kv, hooks=hooks, scaling=scaling,
                           scattered=not exact)  # fmt: skip

    def decode_passes(self, seqs: Seq[Sequence]) -> list[ForwardPass]:
        """Feed each sequence's last token at its position, into the next free slot of its cache. The
        tokens and positions of all of them go to the device in one copy (on a GPU each copy from host
        memory waits for the device: one per step, not two per sequence)."""
        if not seqs:
            return []
        device = seqs[0].cache.keys.device
        both = torch.tensor([[seq.token_ids[-1] for seq in seqs], [seq.next_position for seq in seqs]], device=device)
        return [ForwardPass(token_ids=both[0, i : i + 1], positions=both[1, i : i + 1], slots=seq.cache.reserve(1),
                            decode=True, scaling=_scaling(seq)) for i, seq in enumerate(seqs)]  # fmt: skip

    def run(self, passes: Seq[ForwardPass], caches: Seq[KVCache]) -> list[ForwardOutput]:
        if len(passes) == 1:
            return [self.model(passes[0], caches[0])]
        return self.model.forward_batch(passes, caches)

    def fed_kv(self, cache: KVCache, start: int = 0) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Raw (position-free) K and V of the tokens fed into ``cache`` from ``start`` on, ``[layers,
        kv_heads, n - start, head_dim]``; None unless its slots hold positions 0..n-1 in order (then
        they are a prefix another request can read; a cache compacted by decode KV eviction never does)."""
        n = cache.length
        positions = torch.arange(n, device=cache.keys.device)
        if not n or not bool((cache.positions[:n] == positions).all() and cache.valid[:n].all()):
            return None
        return position_free_kv(self.model, cache, start, n)

    @staticmethod
    def next_tokens(logits: Seq[torch.Tensor], seqs: Seq[Sequence]) -> list[int | Exception]:
        """Each sequence's next token from its [vocab] logits row, by its sampling settings (greedy:
        the argmax of every row, read back in one transfer), or the exception its draw raised."""
        if not logits:
            return []
        states = [SamplingState(seq.sampling, seq.generator, seq.prompt_ids, seq.token_ids, seq.constraint) for seq in seqs]
        return next_tokens(torch.stack(list(logits)), states)

    def teacher_forced(self, seq: Sequence, tokens: Seq[int]) -> torch.Tensor:
        """``[len(tokens) + 1, vocab]``: the logits after ``seq``'s prompt, then after each of ``tokens``,
        which run in one pass at the positions after the prompt (its cache needs room for them)."""
        if not tokens:
            return seq.prompt_logits[None]
        cache, device = seq.cache, seq.cache.keys.device
        ids = torch.tensor(list(tokens), device=device, dtype=torch.long)
        positions = torch.arange(seq.prompt_end, seq.prompt_end + len(ids), device=device)
        out = self.model(ForwardPass(ids, positions, cache.reserve(len(ids)), scaling=_scaling(seq)), cache)
        return torch.cat([seq.prompt_logits[None], out.logits])


def _scaling(seq: Sequence) -> AttentionScaling | None:
    """The rescaled attention ``seq``'s method gives every step of it, if any."""
    return None if seq.method_run is None else seq.method_run.scaling
