"""A request's resolve plan: where each segment sits and which stored entries may serve it.

The bookkeeping half of the alternative path (docs/store.md, the prefix cache), in plain Python: slots,
path-block keys and chunk-entry keys, each computed once per request and read by both the
asynchronous loader (``prefetch_keys``) and assembly. Exact KV of a prompt is stored as a chain of
path blocks, one per boundary: segment 0, then (with the prefix cache on and a lossless store)
each chunk together with the text before it. A block's key chains on the key before it, so a plan
hashes each prompt token once whatever the number of boundaries.

Example:
    >>> from fusionrag_llm.methods import make_plan
    >>> from fusionrag_llm.fusion.entry_keys import EntryKeys
    >>> from fusionrag_llm.request import Segment
    >>> keys = EntryKeys("ab" * 32, s0_ids=(1, 2), lossless=True)
    >>> segments = [Segment("prefix", "", (1, 2)), Segment("chunk", "", (7, 8)), Segment("suffix", "", (9,))]
    >>> plan = plan_context(segments, make_plan("fusionrag", 0.1), keys, prefix_cache=True)
    >>> [(b.segment, b.start, b.end) for b in plan.boundaries]
    [(0, 0, 2), (1, 2, 4)]
    >>> [c.variant for c in plan.segments[1].candidates]  # right after S0: its plain entry is exact
    ['plain']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Sequence

from fusionrag_llm.engine.stats import GenerationStats
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.fusion.entry_keys import EntryKeys, TokenIds
from fusionrag_llm.methods.base import RunPlan
from fusionrag_llm.request import Segment


@dataclass(frozen=True)
class Boundary:
    """One path block: the slots from the previous boundary to the end of ``segment``."""

    segment: int  # index of the segment the block ends with (the prefix or a chunk)
    start: int  # first slot of the block
    end: int  # one past its last slot
    key: str  # chained on the key of the block before


@dataclass(frozen=True)
class ChunkCandidate:
    variant: str  # "fused" or "plain"
    key: str


@dataclass(frozen=True)
class PlannedSegment:
    kind: str
    token_ids: TokenIds
    start: int  # first slot
    end: int  # one past its last slot
    path_key: str | None = None  # key of the path block this segment ends, when it ends one
    candidates: tuple[ChunkCandidate, ...] = ()  # entries that may serve it, first choice first; () = computed
    exact_plain: bool = False  # a chunk right after S0: its plain entry is its path's exact KV
    chunk_id: str | None = None  # the catalog id of a chunk's text (what fused entries name as neighbours)
    position: int | None = None  # position of its first token; None: its first slot (the usual layout)
    # a chunk's own first ids held glued in the token before it: its entry is that of ``entry_ids``,
    # placed from row ``len(glued_ids)`` on (``Segment.glued_ids``)
    glued_ids: TokenIds = ()

    @property
    def first_position(self) -> int:
        return self.start if self.position is None else self.position

    @property
    def entry_ids(self) -> TokenIds:
        """The ids of the entry that serves it: the chunk's own, glued ones included."""
        return self.glued_ids + self.token_ids


@dataclass(frozen=True)
class ContextPlan:
    """Everything about a request's context that needs no tensor, computed once."""

    segments: tuple[PlannedSegment, ...]
    boundaries: tuple[Boundary, ...]
    prompt_ids: TokenIds
    exact_blocks: bool  # the store keeps exact path blocks; False: none, exact prefixes in memory
    chunk_kv: str | None = "plain"  # the method's ``chunk_kv``: which stored variant serves each chunk

    @property
    def prompt_end(self) -> int:
        """The position after the prompt's last one: its length, unless chunks share positions."""
        return max((s.first_position + len(s.token_ids) for s in self.segments), default=0)

    @property
    def chunk_ids(self) -> frozenset[str]:
        """Catalog ids of the request's chunks."""
        return frozenset(s.chunk_id for s in self.segments if s.chunk_id is not None)

    def block_ids(self, boundary: Boundary) -> TokenIds:
        return self.prompt_ids[boundary.start : boundary.end]

    def prefetch_keys(self) -> list[tuple[str, TokenIds]]:
        """(key, token ids) of every entry assembly reads first: path blocks, then chunks' first choices,
        and, under ``chunk_kv="blend"`` (which reads both), the plain entry behind a fused one.

        Otherwise fallbacks (a chunk's plain entry behind its fused one) are read only on a miss, so
        they are not fetched ahead: that would load two entries for every chunk that has its first choice.
        """
        wanted = {b.key: self.block_ids(b) for b in self.boundaries}
        both = self.chunk_kv == "blend"
        for segment in self.segments:
            if segment.candidates:
                wanted.setdefault(segment.candidates[0].key, segment.entry_ids)
                if both and segment.candidates[0].variant == "fused" and segment.candidates[-1].variant == "plain":
                    wanted.setdefault(segment.candidates[-1].key, segment.entry_ids)
        return list(wanted.items())


@dataclass
class ResolveCounts:
    """What assembling one context found, returned for the caller to merge into its stats."""

    path_hits: dict[str, int] = field(default_factory=lambda: {"exact": 0, "chunk": 0, "miss": 0})
    tier_hits: dict[str, int] = field(default_factory=dict)
    variant_hits: dict[str, int] = field(default_factory=lambda: {"fused": 0, "plain": 0})
    computed_tokens: int = 0  # tokens run through the model to make missing entries
    # the method's chunk choice: fused entries found but not served (``fused_declined``, Cache-Craft's
    # choice) or served alone because the prompt holds their neighbours (``fused_in_context``, the blend)
    method: dict[str, int] = field(default_factory=dict)

    def merge_into(self, stats: GenerationStats) -> None:
        for mine, theirs in ((self.path_hits, stats.path_hits), (self.tier_hits, stats.tier_hits),
                             (self.variant_hits, stats.variant_hits)):  # fmt: skip
            for name, count in mine.items():
                theirs[name] = theirs.get(name, 0) + count
        stats.computed_tokens += self.computed_tokens
        for name, count in self.method.items():
            stats.method_stats[name] = stats.method_stats.get(name, 0) + count


def plan_context(segments: Sequence[Segment], run_plan: RunPlan, keys: EntryKeys, prefix_cache: bool) -> ContextPlan:
    """The plan of a request's ``segments`` under ``run_plan``; ``prefix_cache``: chunks end path blocks."""
    if not segments:
        raise ValueError("a context needs at least its prefix segment")
    spans = _spans(segments)
    ids = tuple(chain.from_iterable(segment.token_ids for segment in segments))
    parallel = run_plan.method.parallel_positions
    # chunks sharing positions: no exact path after the prefix can serve them
    boundaries = _boundaries(segments, spans, ids, keys, prefix_cache and not parallel)
    positions = _parallel_positions(segments) if parallel else [None] * len(segments)
    ends = {boundary.segment: boundary.key for boundary in boundaries}
    first = _first_chunk_index(segments, run_plan, keys)
    exact = first if keys.lossless else None
    planned = []
    for index, (segment, (start, end)) in enumerate(zip(segments, spans)):
        candidates = _candidates(segment, run_plan, keys, index == first)
        chunk_id = chunk_id_of(segment.text) if segment.kind == "chunk" else None
        planned.append(PlannedSegment(segment.kind, tuple(segment.token_ids), start, end, ends.get(index),
                                      candidates, index == exact, chunk_id, positions[index],
                                      tuple(segment.glued_ids)))  # fmt: skip
    return ContextPlan(tuple(planned), tuple(boundaries), ids, keys.exact_blocks, run_plan.method.chunk_kv)


def _parallel_positions(segments: Sequence[Segment]) -> list[int | None]:
    """APE's layout: every chunk starts right after segment 0; the other text (between chunks, the
    suffix) follows the longest chunk, in prompt order."""
    head = len(segments[0].token_ids)
    chunks = [len(s.token_ids) for s in segments if s.kind == "chunk"]
    after = head + max(chunks, default=0)
    positions: list[int | None] = [0]
    for segment in segments[1:]:
        if segment.kind == "chunk":
            positions.append(head)
        else:
            positions.append(after)
            after += len(segment.token_ids)
    return positions


def _spans(segments: Sequence[Segment]) -> list[tuple[int, int]]:
    spans, start = [], 0
    for segment in segments:
        spans.append((start, start + len(segment.token_ids)))
        start += len(segment.token_ids)
    return spans


def _boundaries(segments: Sequence[Segment], spans: list[tuple[int, int]], ids: TokenIds, keys: EntryKeys,
                prefix_cache: bool) -> list[Boundary]:  # fmt: skip
    """Segment 0 ends a block, and so does each chunk with the prefix cache on; none in a store that
    keeps no exact blocks (a quantizing codec's)."""
    if not keys.exact_blocks:
        return []
    found: list[Boundary] = []
    for index, (segment, (_, end)) in enumerate(zip(segments, spans)):
        if index == 0 or (segment.kind == "chunk" and prefix_cache):
            start = found[-1].end if found else 0
            key = keys.path_block_key(found[-1].key if found else None, ids[start:end])
            found.append(Boundary(index, start, end, key))
    return found


def _first_chunk_index(segments: Sequence[Segment], run_plan: RunPlan, keys: EntryKeys) -> int | None:
    """Index of the chunk whose plain entry is its exact KV (up to the store's codec): one right after
    a prefix equal to S0. It is served from that entry, never a fused one; in a lossless store it is
    exact (nothing to recompute), in a lossy one a reused chunk like the others."""
    if not run_plan.reuses_chunks or len(segments) < 2 or segments[1].kind != "chunk" or segments[1].glued_ids:
        return None
    return 1 if tuple(segments[0].token_ids) == keys.s0_ids else None


def _candidates(segment: Segment, run_plan: RunPlan, keys: EntryKeys, first: bool) -> tuple[ChunkCandidate, ...]:
    """A reused chunk's entries in fallback order: its variant, then plain (on a miss: computed plain);
    the first chunk after S0: plain only."""
    if segment.kind != "chunk" or not run_plan.reuses_chunks:
        return ()
    variant = "plain" if first or run_plan.method.chunk_kv == "plain" else "fused"
    order = (variant, "plain") if variant != "plain" else ("plain",)
    ids = tuple(segment.glued_ids) + tuple(segment.token_ids)  # a glued chunk's entry is still the whole chunk's
    return tuple(ChunkCandidate(name, keys.key(ids, name)) for name in order)
