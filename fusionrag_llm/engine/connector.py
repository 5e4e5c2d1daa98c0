"""Moving KV between the request caches and where it is kept, beside the forward: one connector.

The shape is vLLM v1's KV connector: the engine asks it to start loading, waits for what it needs,
and hands it what to save; it never reaches the store, the loader thread or the turn cache itself.

Loading:

* ``start_load(seqs)``: the chunk entries of waiting sequences load on a background thread (started
  with the first, closed once none waits, so an idle engine holds no thread); ``loaded(seq)`` says
  whether admitting ``seq`` now would wait for it; ``take(seq)`` hands over what was loaded (waiting
  if needed), pinned in the store (eviction can neither drop nor move it) until the sequence's
  context is assembled (``ContextResolver.release``) or the sequence is dropped (``discard``).
* ``match_turn(seq, tenant)``: the longest prefix of the prompt an earlier request of the tenant
  left in the turn cache (a chat's last turn) becomes the sequence's first segment, handed to the
  assembly like a loaded path block.
* ``feed(cache)``: with layer-wise loading (``layerwise``), what the assembly hands a request's
  stored KV to (``fusion/layer_feed.py``): it reaches the cache layer by layer while the forward runs,
  and the forward waits for each layer before reading it (``KVCache.ready``).

Saving:

* ``save_prefill(...)``: after a prefill whose context KV is exact, the path blocks the store lacks.
* ``save_turn(seq)``: a finished request's KV (prompt and answer) for a later turn to start from.
* A method's own write-back (Cache-Craft's request-made variants) runs in its ``after_prefill``.
"""

from __future__ import annotations

import time
from dataclasses import astuple
from typing import Iterable

from fusionrag_llm.engine.resolve import ContextResolver, Preloaded, ResolvedContext
from fusionrag_llm.engine.sequence import Sequence
from fusionrag_llm.engine.tenants import TenantScope
from fusionrag_llm.fusion.layer_feed import LayerFeed
from fusionrag_llm.methods.base import RunPlan
from fusionrag_llm.models.forward import ForwardOutput
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.prefix_cache import EXACT, PrefixCache, tenant_namespace
from fusionrag_llm.request import Segment, split_segments
from fusionrag_llm.storage import KVEntry, PrefetchLoader


class KVConnector:
    def __init__(self, store, runner, turns: PrefixCache | None, exact_blocks: bool, layerwise: bool = False):
        self.store, self.runner = store, runner
        self.turns = turns  # multi-turn reuse: finished requests' KV by token blocks (None: off)
        self.exact_blocks = exact_blocks  # the store keeps exact path blocks (not a lossy codec's)
        self.layerwise = layerwise  # stored KV reaches request caches layer by layer (``feed``)
        self._loader: PrefetchLoader | None = None
        self._submitted: set[int] = set()

    # ------------------------------------------------------------------ loading
    def start_load(self, seqs: Iterable[Sequence]) -> None:
        """Start loading the chunk entries of ``seqs`` (each once) on the loader thread."""
        for seq in seqs:
            if seq.request_id in self._submitted:
                continue
            wanted = seq.context_plan.prefetch_keys()
            if self._loader is None:
                self._loader = PrefetchLoader(self.store)
            self._loader.submit(seq.request_id, [key for key, _ in wanted], dict(wanted))
            self._submitted.add(seq.request_id)

    def loaded(self, seq: Sequence) -> bool:
        """Whether admitting ``seq`` now would not wait for the loader."""
        if seq.request_id in self._submitted:
            return self._loader.ready(seq.request_id)
        return not seq.prefetch  # a prefetching sequence not submitted yet is not ready

    def take(self, seq: Sequence) -> tuple[Preloaded | None, list[str]]:
        """The entries loaded for ``seq`` (waiting for them if needed) and the keys pinned for them,
        which the taker unpins; else what the caller preloaded, with no pins."""
        if seq.request_id not in self._submitted:
            return seq.preloaded, []
        self._submitted.discard(seq.request_id)
        waited = time.perf_counter()
        loaded = self._loader.wait(seq.request_id)
        seq.stats.wait_s = time.perf_counter() - waited
        seq.stats.prefetch_s, seq.stats.prefetched_entries = loaded.load_s, len(loaded.entries)
        found = {key: (entry, loaded.tiers[key]) for key, entry in loaded.entries.items()}
        return {**(seq.preloaded or {}), **found}, loaded.pinned

    def discard(self, seq: Sequence) -> None:
        """Forget ``seq``'s load (its pins are dropped)."""
        if seq.request_id in self._submitted:
            self._submitted.discard(seq.request_id)
            self._loader.discard(seq.request_id)

    def release_if_idle(self, waiting: Iterable[Sequence]) -> None:
        """Close the loader thread once nothing is submitted and no waiting sequence prefetches."""
        if self._loader is not None and not self._submitted and not any(seq.prefetch for seq in waiting):
            self._loader.close()
            self._loader = None

    def feed(self, cache: KVCache) -> LayerFeed | None:
        """What the assembly of ``cache``'s context places stored KV through, layer by layer (None: whole)."""
        return LayerFeed(self.runner.model, cache) if self.layerwise else None

    def match_turn(self, seq: Sequence, scope: TenantScope) -> None:
        """Start ``seq`` from the longest prefix of its prompt that an earlier request of its tenant
        kept (a chat's last turn): that prefix becomes segment 0, handed to the assembly as its path
        block. In a store that keeps no path blocks (a lossy codec's), only a prefix that reaches past
        the prompt's first segment: the prefix cache keeps and serves that segment whole."""
        plan, keys = seq.plan, scope.keys
        if self.turns is None or plan.reproducible or not self._turns_apply(plan):
            return
        exact = tenant_namespace(scope.tenant, EXACT)
        namespaces = [exact] if plan.exact else [exact, tenant_namespace(scope.tenant, namespace_of(plan))]
        # a store without path blocks: the prefix cache serves the first segment whole, so only more counts
        first = 0 if self.exact_blocks else len(seq.segments[0].token_ids)
        hit = self.turns.lookup(seq.prompt_ids, namespaces, limit=seq.num_prompt_tokens - 1, beyond=first)
        length = 0 if hit is None else chunk_aligned(seq.segments, hit.length)
        if length <= first:
            return
        seq.segments = split_segments(seq.segments, length)
        ids = tuple(seq.prompt_ids[:length])
        device = self.runner.model.device
        entry = KVEntry(ids, hit.keys[:, :, :length].to(device), hit.values[:, :, :length].to(device), keys.meta("path"))
        seq.preloaded = {**(seq.preloaded or {}), keys.path_block_key(None, ids): (entry, "host")}
        seq.stats.turn_tokens = length
        if hit.namespace != exact:  # an approximated prefix: the whole context is approximated
            seq.kv_namespace = hit.namespace

    # ------------------------------------------------------------------ saving
    def save_prefill(self, seq: Sequence, resolver: ContextResolver, resolved: ResolvedContext, recomputed,
                     out: ForwardOutput, exact: bool) -> None:  # fmt: skip
        """After ``seq``'s prefill: record whose KV its context now holds (exact: any later request may
        read it; else this plan's own) and, when exact, store the path blocks the store lacks."""
        exact_kv = exact and seq.plan.method.attention_scaling is None
        seq.kv_namespace = tenant_namespace(seq.tenant, EXACT if exact_kv else namespace_of(seq.plan))
        if exact:
            resolver.store_exact_blocks(resolved, recomputed, out.raw_keys, out.raw_values, seq.prompt_ids)

    def save_turn(self, seq: Sequence) -> None:
        """Keep a finished request's KV (prompt and answer) for a later turn to start from."""
        if self.turns is None or seq.finish_reason not in ("stop", "length") or seq.cache is None:
            return
        if not self._turns_apply(seq.plan):
            return
        ids = (seq.prompt_ids + seq.token_ids)[: seq.cache.length]
        start = self.turns.kept(ids, seq.kv_namespace)  # an earlier turn's blocks: not read back again
        fed = self.runner.fed_kv(seq.cache, start)
        if fed is not None:
            self.turns.remember(ids, fed[0], fed[1], seq.kv_namespace, start)

    def _turns_apply(self, plan: RunPlan) -> bool:
        """Whether runs under ``plan`` read and keep turn KV: not when chunks share positions or see
        rescaled attention (no prefix of such a context is a plain path)."""
        method = plan.method
        return not method.parallel_positions and method.attention_scaling is None


def namespace_of(plan: RunPlan) -> str:
    """The namespace a run under ``plan`` reads besides ``EXACT`` (and writes when not exact)."""
    return "plan:" + repr((plan.name, astuple(plan.method), plan.recompute_ratio))


def chunk_aligned(segments: list[Segment], length: int) -> int:
    """``length`` moved back to the start of the chunk it ends inside, if any: the rest of a chunk
    would be computed as text, while the whole chunk is served from its entry."""
    start = 0
    for segment in segments:
        end = start + len(segment.token_ids)
        if start < length < end and segment.kind == "chunk":
            return start
        start = end
    return length
