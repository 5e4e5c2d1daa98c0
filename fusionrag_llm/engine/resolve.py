"""Resolving a request's context: the longest exact path first, then each chunk's single entry.

The paper's alternative path (docs/store.md, the prefix cache). ``plan`` names every entry the request may
read (``fusionrag_llm.engine.plan``, no tensors); ``assemble_plan`` walks the chain of path blocks
as far as the store has it, then serves the chunks after that from their fused or plain entries,
computing a missing plain entry once, and places everything in the request's cache. Blocks are
written only by runs whose context KV is exact, in the compute dtype (also in a store whose chunk
entries are bf16 or fp16), and never to a quantizing codec's store (whose tiers keep packed KV).

Entries are read without a copy and pinned until ``release``: from the store lookup (or the
loader's, for ``pinned`` preloaded keys) until their KV has been placed in the request's cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from fusionrag_llm.engine.blend import blend_entry, context_in_place
from fusionrag_llm.engine.plan import Boundary, ContextPlan, PlannedSegment, ResolveCounts, plan_context
from fusionrag_llm.fusion.entry_compute import EntryComputer
from fusionrag_llm.fusion.craft import VariantNotes, fix_overhead, fused_notes, plain_notes
from fusionrag_llm.fusion.layer_feed import LayerFeed
from fusionrag_llm.fusion.placement import place_entry
from fusionrag_llm.fusion.request_variants import RequestVariants, StoredVariant, VariantRecorder, recorder_for, store_variants
from fusionrag_llm.fusion.layout import RequestLayout
from fusionrag_llm.methods.base import RunPlan
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.request import Segment
from fusionrag_llm.storage import KVEntry

__all__ = ["Boundary", "ContextPlan", "ContextResolver", "Preloaded", "ResolveCounts", "ResolvedContext"]

Preloaded = dict[str, tuple[KVEntry, str]]
# Cache-Craft (``craft_variants``): a chunk served after a prefix none of its variants was made after,
# that prefix (catalog ids) and the serving variant's token order (``fusion/request_variants.py``)
NewVariant = tuple[PlannedSegment, tuple[str, ...], tuple[int, ...]]


@dataclass
class ResolvedContext:
    layout: RequestLayout
    boundaries: list[Boundary]
    matched: int  # leading boundaries whose KV is already stored (served from path blocks or known exact)
    new_variants: list[NewVariant] = field(default_factory=list)  # the variants this request makes


@dataclass
class _Placed:
    """Slots of the non-exact part of a context, by what will happen to them."""

    reused: list[torch.Tensor]  # chunk tokens served from entries
    fresh: list[torch.Tensor]  # tokens computed in the prefill
    suffix: list[torch.Tensor]
    missed: list[torch.Tensor] = field(default_factory=list)  # reused chunk tokens whose entry was computed now
    # chunk_kv="cfo": chunk start -> (Cache Fix Overhead of the variant serving it, its token order)
    craft: dict[int, tuple[float, tuple[int, ...]]] = field(default_factory=dict)
    new_variants: list[NewVariant] = field(default_factory=list)


class ContextResolver:
    def __init__(self, computer: EntryComputer, preloaded: Preloaded | None = None, prefix_cache: bool = True,
                 pinned: Sequence[str] = (), variants: RequestVariants | None = None):  # fmt: skip
        self.variants = variants  # Cache-Craft's request-made variants (None: not kept)
        self.pinned = list(pinned)  # store keys pinned for this resolver (preloaded ones, then its own reads)
        self.keys, self.entry_store, self.computer = computer.keys, computer.entry_store, computer
        self.model = computer.model
        self.preloaded = preloaded or {}  # key -> (entry, tier it came from), fetched ahead by the loader
        self.prefix_cache = prefix_cache  # False: only the prompt prefix is cached, chunks never by path
        self._feed: LayerFeed | None = None  # while assembling layer by layer

    # ------------------------------------------------------------------ the plan API
    def plan(self, segments: Sequence[Segment], run_plan: RunPlan) -> ContextPlan:
        """Slots and keys of every entry the request may read; computed once, no tensors."""
        return plan_context(segments, run_plan, self.keys, self.prefix_cache)

    def assemble_plan(self, context_plan: ContextPlan, cache: KVCache,
                      feed: LayerFeed | None = None) -> tuple[ResolvedContext, ResolveCounts]:  # fmt: skip
        """Place the context's stored or computed KV into ``cache``; returns where it went and what was found.

        ``feed``: the entries' K/V follow layer by layer while the forward runs (Cache-Craft's
        layer-wise preloading, ``fusion/layer_feed.py``, from ``KVConnector.feed``); the cache holds the
        feed until settled."""
        counts = ResolveCounts()
        self._feed = feed
        matched = self._place_exact_blocks(context_plan, cache, counts)
        if matched == 0:
            self._place_prefix(context_plan, cache, counts)
            matched = 1 if context_plan.boundaries else 0
        first = context_plan.boundaries[matched - 1].segment + 1 if matched else 1
        placed = _Placed([], [], [])
        ahead = _chunks_ahead(context_plan)
        cfo = context_plan.chunk_kv == "cfo"
        if self.variants is not None and cfo:
            self.variants.refresh()  # what other processes listed since, once per request
        for index, segment in enumerate(context_plan.segments[first:], start=first):
            if segment.candidates:
                misses = counts.path_hits["miss"]
                if cfo and not segment.exact_plain:
                    entry = self._craft_entry(segment, counts, ahead[index], placed)
                else:
                    entry = self._chunk_entry(segment, counts)
                plain = self._plain_alternative(segment, entry, context_plan, ahead[index], counts)
                if plain is not None:  # chunk_kv="blend"
                    entry = blend_entry(entry, plain, cache.keys.device, cache.keys.dtype)
                slots = self._place(cache, entry, segment.first_position, len(segment.glued_ids))
                if segment.exact_plain:  # exact KV: nothing to recompute, and its path block is known
                    matched += 1 if segment.path_key is not None else 0
                else:
                    placed.reused.append(slots)
                    if counts.path_hits["miss"] > misses:
                        placed.missed.append(slots)
            else:
                self._reserve_fresh(segment, cache, placed)
        layout = _layout(context_plan, placed, cache)
        if self._feed is not None:
            cache.feed, self._feed = self._feed, None
            cache.feed.start()
        return ResolvedContext(layout, list(context_plan.boundaries), matched, placed.new_variants), counts

    def _plain_alternative(self, segment: PlannedSegment, entry: KVEntry, context_plan: ContextPlan,
                           ahead: list[str], counts: ResolveCounts) -> KVEntry | None:  # fmt: skip
        """Under chunk_kv="blend", the stored plain entry of a chunk served by its fused one (the two are
        mixed before placing); None also when the request holds the fused entry's own context
        (``ahead``: the chunks before it), which then serves alone (counted)."""
        if context_plan.chunk_kv != "blend" or entry.meta.get("variant") != "fused":
            return None
        if context_in_place(entry.meta, ahead):
            counts.method["fused_in_context"] = counts.method.get("fused_in_context", 0) + 1
            return None
        plain = segment.candidates[-1]  # the last candidate is always plain
        found = self._fetch(plain.key, segment.entry_ids, plain.variant) if plain.variant == "plain" else None
        return None if found is None else found[0]

    def _handed(self, key: str, token_ids: Sequence[int], variant: str = "path") -> tuple[KVEntry, str] | None:
        """What the caller handed over under ``key``, if it holds ``token_ids`` and is what ``key`` names."""
        found = self.preloaded.get(key)
        if found is not None and found[0].token_ids == tuple(token_ids) and self.keys.accepts(found[0], key, variant):
            return found
        return None

    def _fetch(self, key: str, token_ids: Sequence[int], variant: str) -> tuple[KVEntry, str] | None:
        found = self._handed(key, token_ids, variant)
        if found is not None:
            return found
        found = self.entry_store.fetch(key, token_ids, variant, pin=True)
        if found is not None:
            self.pinned.append(key)
        return found

    def release(self) -> None:
        """Unpin every entry this resolver read or was handed pinned (call once the KV is placed)."""
        pinned, self.pinned = self.pinned, []
        for key in pinned:
            self.entry_store.store.unpin(key)

    def _place_exact_blocks(self, context_plan: ContextPlan, cache: KVCache, counts: ResolveCounts) -> int:
        """Place the leading path blocks the store holds; returns how many."""
        matched = 0
        for boundary in context_plan.boundaries:
            found = self._fetch(boundary.key, context_plan.block_ids(boundary), "path")
            if found is None:
                break
            entry, tier = found
            self._place(cache, entry, boundary.start)
            _count_tier(counts, tier)
            counts.path_hits["exact"] += 1 if boundary.segment > 0 else 0
            matched += 1
        return matched

    def _place_prefix(self, context_plan: ContextPlan, cache: KVCache, counts: ResolveCounts) -> None:
        """KV of segment 0 when no path block served it: computed; in a store that keeps no path blocks (a
        lossy codec's), an earlier turn's KV handed over for it (``KVConnector.match_turn``), else the exact
        prefix from the prefix cache or computed."""
        prefix = context_plan.segments[0]
        if context_plan.boundaries:  # exact blocks kept: its block was just found missing, so compute and store it
            entry, computed = self.computer.compute_exact(prefix.token_ids), len(prefix.token_ids)
            self.entry_store.put_block(context_plan.boundaries[0].key, entry)
        elif (turn := self._handed(self.keys.path_block_key(None, prefix.token_ids), prefix.token_ids)) is not None:
            (entry, tier), computed = turn, 0
            _count_tier(counts, tier)
        else:
            entry, computed = self.computer.prefix_entry(prefix.token_ids)
        counts.computed_tokens += computed
        self._place(cache, entry, 0)

    def _place(self, cache: KVCache, entry: KVEntry, start_position: int, first_row: int = 0) -> torch.Tensor:
        if self._feed is not None:
            return self._feed.place(entry, start_position, first_row)
        return place_entry(self.model, cache, entry, start_position, first_row=first_row)

    def _chunk_entry(self, segment: PlannedSegment, counts: ResolveCounts) -> KVEntry:
        """The first of the segment's candidates the store has, else its plain entry computed and stored."""
        for candidate in segment.candidates:
            found = self._fetch(candidate.key, segment.entry_ids, candidate.variant)
            if found is not None:
                return self._hit(segment, counts, candidate.variant, found)
        return self._computed_plain(segment, counts)

    def _craft_entry(self, segment: PlannedSegment, counts: ResolveCounts, ahead: list[str], placed: _Placed) -> KVEntry:
        """chunk_kv="cfo" (Cache-Craft, ``fusion/craft.py``): of the chunk's variants (fused,
        plain, and those requests made, ``fusion/request_variants.py``), the one with the lowest Cache
        Fix Overhead given the chunks ``ahead`` of it; ties: a request's, then fused, then plain. The
        plain one's overhead needs no data, so it is read only when it wins (or the others are missing)."""
        fused, notes, glued = None, None, len(segment.glued_ids)
        if segment.candidates[0].variant == "fused":
            fused = self._fetch(segment.candidates[0].key, segment.entry_ids, "fused")
        if fused is not None:
            notes = fused_notes(fused[0].meta, len(segment.entry_ids))
        served_order = notes.order if notes is not None else ()  # which tokens look outside: the fused ranking
        made = self.variants.of(segment.chunk_id) if self.variants is not None else []
        plain_fix = fix_overhead(plain_notes(), ahead)
        choices: list[tuple[float, int, StoredVariant | str]] = [(plain_fix, 2, "plain")]
        choices += [(fix_overhead(notes, ahead), 1, "fused")] if notes is not None else []
        choices += [(fix_overhead(v.notes(), ahead), 0, v) for v in made]
        # a glued chunk's request holds only part of it: no whole variant to make from it
        if self.variants is not None and not glued and tuple(ahead) not in {
                (), *(v.prefix for v in made), *([notes.prefix] if notes is not None else [])}:  # fmt: skip
            placed.new_variants.append((segment, tuple(ahead), served_order))
        for fix, _, choice in sorted(choices, key=lambda c: (c[0], c[1])):
            if choice == "fused":
                placed.craft[segment.start] = (fix, _placed_order(served_order, glued))
                return self._hit(segment, counts, "fused", fused)
            if choice == "plain":
                break
            found = self._fetch(choice.key, segment.entry_ids, "request")
            if found is not None:
                own = VariantNotes.from_meta(found[0].meta, choice.prefix, len(segment.entry_ids))
                order = own.order if own is not None else served_order
                placed.craft[segment.start] = (fix, _placed_order(order, glued))
                self.variants.used(choice.key, fix)
                return self._hit(segment, counts, "request", found)
        placed.craft[segment.start] = (plain_fix, _placed_order(served_order, glued))
        plain = segment.candidates[-1]
        found = self._fetch(plain.key, segment.entry_ids, "plain")
        if fused is not None:
            counts.method["fused_declined"] = counts.method.get("fused_declined", 0) + 1
        return self._computed_plain(segment, counts) if found is None else self._hit(segment, counts, "plain", found)

    @staticmethod
    def _hit(segment: PlannedSegment, counts: ResolveCounts, variant: str, found: tuple[KVEntry, str]) -> KVEntry:
        counts.path_hits["exact" if segment.exact_plain else "chunk"] += 1
        counts.variant_hits[variant] = counts.variant_hits.get(variant, 0) + (0 if segment.exact_plain else 1)
        _count_tier(counts, found[1])
        return found[0]

    def _computed_plain(self, segment: PlannedSegment, counts: ResolveCounts) -> KVEntry:
        entry = self.entry_store.as_stored(self.computer.compute_plain([segment.entry_ids])[0])
        self.entry_store.put_keyed(segment.candidates[-1].key, entry)  # the last candidate is always plain
        counts.path_hits["miss"] += 1
        counts.computed_tokens += len(segment.entry_ids)
        return entry

    @staticmethod
    def _reserve_fresh(segment: PlannedSegment, cache: KVCache, placed: _Placed) -> None:
        slots = cache.reserve(len(segment.token_ids))
        cache.positions[slots] = slots + (segment.first_position - segment.start)  # valid once computed
        placed.fresh.append(slots)
        if segment.kind == "suffix":
            placed.suffix.append(slots)

    # ------------------------------------------------------------------ writing request-made variants
    def variant_recorder(self, resolved: ResolvedContext) -> VariantRecorder | None:
        """What measures the notes of the variants this request makes (None: it makes none)."""
        return recorder_for([seg for seg, _, _ in resolved.new_variants], resolved.layout.chunk_spans,
                            self.model.cfg.head_dim)  # fmt: skip

    def store_request_variants(self, resolved: ResolvedContext, cache: KVCache, recorder: VariantRecorder) -> int:
        """After the prefill: the new variants stored and listed (``fusion/request_variants.store_variants``)."""
        return store_variants(self.model, self.entry_store, self.variants, resolved.new_variants, cache, recorder)

    # ------------------------------------------------------------------ writing path blocks
    def store_exact_blocks(self, resolved: ResolvedContext, recomputed: torch.Tensor,
                           raw_keys: torch.Tensor, raw_values: torch.Tensor, ids: list[int]) -> int:  # fmt: skip
        """After a run whose context is exact, store the path blocks the store did not have yet."""
        stored = 0
        for boundary in resolved.boundaries[resolved.matched :]:
            slots = torch.arange(boundary.start, boundary.end, device=recomputed.device)
            rows = torch.searchsorted(recomputed, slots)
            entry = KVEntry(tuple(ids[boundary.start : boundary.end]), raw_keys[:, :, rows].clone(),
                            raw_values[:, :, rows].clone(), self.keys.meta("path"))  # fmt: skip
            self.entry_store.put_block(boundary.key, entry)
            stored += 1
        return stored


def _chunks_ahead(context_plan: ContextPlan) -> dict[int, list[str]]:
    """For each segment index, the catalog ids of the chunks before it in the prompt, in order."""
    ahead, seen = {}, []
    for index, segment in enumerate(context_plan.segments):
        ahead[index] = list(seen)
        if segment.chunk_id is not None:
            seen.append(segment.chunk_id)
    return ahead


def _placed_order(order: tuple[int, ...], glued: int) -> tuple[int, ...]:
    """A variant's token order (indices into its entry) over the rows placed from row ``glued`` on."""
    return tuple(i - glued for i in order if i >= glued) if glued else order


def _count_tier(counts: ResolveCounts, tier: str) -> None:
    counts.tier_hits[tier] = counts.tier_hits.get(tier, 0) + 1


def _layout(context_plan: ContextPlan, placed: _Placed, cache: KVCache) -> RequestLayout:
    device = cache.keys.device
    empty = torch.zeros(0, dtype=torch.long, device=device)
    n = len(context_plan.prompt_ids)
    parallel = any(segment.position is not None for segment in context_plan.segments)
    chunks = [seg for seg in context_plan.segments if seg.kind == "chunk"]
    # chunk_kv="cfo": each chunk's overhead and token order (exact chunks: none to fix)
    craft = [placed.craft.get(seg.start, (0.0, ())) for seg in chunks] if placed.craft else []
    return RequestLayout(
        token_ids=torch.tensor(context_plan.prompt_ids, device=device),
        reused_slots=torch.cat(placed.reused) if placed.reused else empty,
        fresh_slots=torch.cat(placed.fresh),
        suffix_slots=torch.cat(placed.suffix),
        chunk_spans=tuple((seg.start, seg.end) for seg in chunks),
        missed_slots=torch.cat(placed.missed) if placed.missed else empty,
        prefix_length=context_plan.segments[0].end,
        positions=cache.positions[:n].clone() if parallel else None,
        chunk_fix=tuple(fix for fix, _ in craft),
        chunk_order=tuple(order for _, order in craft),
    )
