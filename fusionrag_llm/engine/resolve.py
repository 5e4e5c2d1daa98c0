"""Resolving a request's context: the longest exact path first, then each chunk's single entry.

The paper's alternative path (DESIGN.md section 4.1). Exact KV of a prompt is stored as a chain of
path blocks, one per boundary (the prefix, then each chunk with the text before it), each keyed by
every segment up to that boundary, like a prefix cache's hash chain. A request walks the chain as
far as the store has it; the chunks after that come from their plain or fused entries, or are
computed once on a miss. Blocks are written only by runs whose context KV is exact, and only to a
lossless store (one that keeps the compute dtype): KV read back from a lossy store is not exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Sequence

import torch

from fusionrag_llm.engine.methods import RunPlan
from fusionrag_llm.engine.stats import GenerationStats
from fusionrag_llm.fusion.chunk_entries import ChunkEntries
from fusionrag_llm.fusion.selectors import RequestLayout
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.request import Segment, prompt_ids
from fusionrag_llm.storage import KVEntry

Preloaded = dict[str, tuple[KVEntry, str]]


@dataclass
class Boundary:
    segment: int  # index of the segment the block ends with (the prefix or a chunk)
    start: int  # first slot of the block
    end: int  # one past its last slot
    key: str


@dataclass
class ResolvedContext:
    layout: RequestLayout
    boundaries: list[Boundary]
    matched: int  # leading boundaries served exactly from path blocks


class ContextResolver:
    def __init__(self, entries: ChunkEntries, preloaded: Preloaded | None = None, prefix_cache: bool = True):
        self.entries = entries
        self.preloaded = preloaded or {}  # key -> (entry, tier it came from), fetched ahead by the loader
        self.prefix_cache = prefix_cache  # False: only the prompt prefix is cached, chunks never by path

    def boundaries(self, segments: Sequence[Segment]) -> list[Boundary]:
        ends = list(accumulate(len(s.token_ids) for s in segments))
        found, start = [], 0
        for index, segment in enumerate(segments):
            if index == 0 or (segment.kind == "chunk" and self.prefix_cache and self.entries.lossless):
                key = self.entries.path_key(*(s.token_ids for s in segments[: index + 1]))
                found.append(Boundary(index, start, ends[index], key))
                start = ends[index]
        return found

    def assemble(self, segments: Sequence[Segment], plan: RunPlan, cache: KVCache, stats: GenerationStats) -> ResolvedContext:
        ids = prompt_ids(segments)
        boundaries = self.boundaries(segments)
        matched = self._place_exact_blocks(boundaries, ids, cache, stats)
        if matched == 0:
            prefix, hit = self.entries.prefix_entry(segments[0].token_ids)
            stats.computed_tokens += 0 if hit else len(prefix.token_ids)
            self.entries.place(cache, prefix, 0)
            matched = 1
        reused, fresh, suffix = [], [], []
        position, first = boundaries[matched - 1].end, boundaries[matched - 1].segment + 1
        if matched == 1 and plan.reuses_chunks and self._plain_is_exact(segments, first):
            # A chunk right after the canonical prefix: its plain entry is that path's exact KV.
            entry = self._chunk_entry(segments[first].token_ids, "plain", stats, exact=True)
            self.entries.place(cache, entry, position)
            position += len(entry.token_ids)
            matched += 1 if len(boundaries) > 1 else 0  # that block is known; do not store it again
            first += 1
        for segment in segments[first:]:
            if segment.kind == "chunk" and plan.reuses_chunks:
                entry = self._chunk_entry(segment.token_ids, plan.kv_variant, stats)
                reused.append(self.entries.place(cache, entry, position))
            else:
                slots = cache.reserve(len(segment.token_ids))
                cache.positions[slots] = slots  # prompt slots equal positions; valid once computed
                fresh.append(slots)
                if segment.kind == "suffix":
                    suffix.append(slots)
            position += len(segment.token_ids)
        device = cache.keys.device
        empty = torch.zeros(0, dtype=torch.long, device=device)
        layout = RequestLayout(
            token_ids=torch.tensor(ids, device=device),
            reused_slots=torch.cat(reused) if reused else empty,
            fresh_slots=torch.cat(fresh),
            suffix_slots=torch.cat(suffix),
        )
        return ResolvedContext(layout, boundaries, matched)

    def _plain_is_exact(self, segments: Sequence[Segment], index: int) -> bool:
        if not self.entries.lossless or index >= len(segments) or segments[index].kind != "chunk":
            return False
        return segments[0].token_ids == self.entries.s0_ids

    def _fetch(self, key: str, token_ids: Sequence[int], variant: str) -> tuple[KVEntry, str] | None:
        found = self.preloaded.get(key)
        if found is not None and found[0].token_ids == tuple(token_ids) and self.entries.accepts(found[0], key, variant):
            return found
        return self.entries.fetch(key, token_ids, variant)

    def _place_exact_blocks(self, boundaries: list[Boundary], ids: list[int], cache: KVCache, stats: GenerationStats) -> int:
        if not self.entries.lossless:
            return 0  # a lossy store holds no exact blocks; the prefix comes from prefix_entry
        matched = 0
        for boundary in boundaries:
            found = self._fetch(boundary.key, ids[boundary.start : boundary.end], "path")
            if found is None:
                break
            entry, tier = found
            self.entries.place(cache, entry, boundary.start)
            stats.tier_hits[tier] = stats.tier_hits.get(tier, 0) + 1
            stats.path_hits["exact"] += 1 if boundary.segment > 0 else 0
            matched += 1
        return matched

    def _chunk_entry(self, token_ids: tuple[int, ...], variant: str, stats: GenerationStats, exact: bool = False) -> KVEntry:
        """The chunk's entry of ``variant``, else its plain entry, else compute and store the plain entry."""
        for name in (variant, "plain") if variant != "plain" else ("plain",):
            found = self._fetch(self.entries.key(token_ids, name), token_ids, name)
            if found is not None:
                entry, tier = found
                stats.path_hits["exact" if exact else "chunk"] += 1
                stats.variant_hits[name] += 0 if exact else 1
                stats.tier_hits[tier] = stats.tier_hits.get(tier, 0) + 1
                return entry
        entry = self.entries.compute_plain([token_ids])[0]
        self.entries.put(entry, "plain")
        stats.path_hits["miss"] += 1
        stats.computed_tokens += len(token_ids)
        return entry

    def store_exact_blocks(self, resolved: ResolvedContext, recomputed: torch.Tensor,
                           raw_keys: torch.Tensor, raw_values: torch.Tensor, ids: list[int]) -> int:  # fmt: skip
        """After a run whose context is exact, store the path blocks the store did not have yet."""
        stored = 0
        for boundary in resolved.boundaries[resolved.matched :]:
            slots = torch.arange(boundary.start, boundary.end, device=recomputed.device)
            rows = torch.searchsorted(recomputed, slots)
            entry = KVEntry(tuple(ids[boundary.start : boundary.end]), raw_keys[:, :, rows].clone(),
                            raw_values[:, :, rows].clone(), self.entries.meta("path"))  # fmt: skip
            self.entries.store.put(boundary.key, entry)
            stored += 1
        return stored

    def keys_to_prefetch(self, segments: Sequence[Segment], plan: RunPlan) -> list[tuple[str, tuple[int, ...]]]:
        """(key, token ids) of every entry this request may read, for the asynchronous loader."""
        ids = prompt_ids(segments)
        wanted = [(b.key, tuple(ids[b.start : b.end])) for b in self.boundaries(segments)]
        if plan.reuses_chunks:
            for segment in segments:
                if segment.kind == "chunk":
                    wanted.append((self.entries.key(segment.token_ids, plan.kv_variant), segment.token_ids))
        return wanted
