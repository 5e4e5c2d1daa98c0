"""Cache-Craft's chunk variants made by served requests (paper 003, section 3.3).

Ingestion stores two variants of every chunk: its plain entry (computed after S0 alone) and its
fused one (after its neighbours). Cache-Craft also keeps the KV a *request* gave a chunk, keyed by
the chunks in front of it there (its *prefix*): a later request with the same chunks in front reads
it with nothing to fix (beta' = 1, CFO = 0), and one with a similar prefix fixes fewer tokens.

With ``craft_variants=M`` (``FusionRAG``), a ``cache_craft`` request that serves a chunk after a
prefix none of the chunk's variants was computed after stores, once its prefill is done:

* the chunk's KV as that request's cache holds it (recomputed tokens exact in this context, the
  others as the variant that served it gave them), keys back to position-free;
* its notes (``fusion/craft.VariantNotes``) measured during the same prefill by ``VariantRecorder``:
  inter/intra attention of the chunk's rows that were computed (all of them for a chunk with no
  stored entry, its recomputed tokens otherwise), and its token order (those tokens by attention
  to the prefix chunks, then the rest in the serving variant's order).

The variants are listed in the store's ``variants.jsonl`` log (one line per variant: key, chunk,
prefix, inter, CCI; a line when one is dropped), so every process on the store reads them. Each
access adds 1 / CFO to the variant's frequency-reuse ``fr`` (this process's count; CFO floored at
``MIN_FIX_OVERHEAD``); once a model's listed variants exceed M per chunk that has any, the lowest
``fr`` are dropped, entry and line. Plain and fused entries are ingestion's: never dropped here.

Where the paper is silent, chosen here (and ``docs/ARCHITECTURE.md`` says so): the notes of a
variant made from a chunk that was served by a stored entry come from its recomputed tokens only
(the others ran no query); ``fr`` is not shared between processes.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Sequence

import torch

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.entry_store import EntryStore
from fusionrag_llm.fusion.craft import VariantNotes, span_attention
from fusionrag_llm.fusion.placement import position_free_kv
from fusionrag_llm.fusion.jsonl import parse_line, whole_lines
from fusionrag_llm.models.forward import LayerHook
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.storage import KVEntry, RecordLog

logger = logging.getLogger(__name__)
VARIANT_LOG = "variants.jsonl"
MIN_FIX_OVERHEAD = 0.01  # an exact prefix match has CFO 0: its fr grows by at most 1 / this per access


def check_craft_variants(value) -> int:
    """``craft_variants``: 0 (off) or the variants per chunk Cache-Craft may keep on average (M)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FusionRAGError(f"craft_variants must be an int >= 0 (0: off; M: request-made variants kept per "
                             f"chunk on average, the paper's M), got {value!r}")  # fmt: skip
    return value


@dataclass(frozen=True)
class StoredVariant:
    """One request-made variant as the log lists it (what choosing it needs, without reading it)."""

    key: str
    chunk_id: str
    prefix: tuple[str, ...]
    inter: tuple[float, ...]
    cci: float

    def notes(self) -> VariantNotes:
        return VariantNotes(self.prefix, self.inter, self.cci)

    def to_json(self, model: str) -> str:
        return json.dumps({"variant": self.key, "model": model, "chunk": self.chunk_id, "prefix": list(self.prefix),
                           "inter": [round(x, 6) for x in self.inter], "cci": round(self.cci, 6)})  # fmt: skip

    @classmethod
    def from_json(cls, record: dict) -> StoredVariant:
        prefix, inter, cci = record["prefix"], record["inter"], record["cci"]
        if not (isinstance(prefix, list) and all(isinstance(c, str) for c in prefix) and isinstance(record["chunk"], str)
                and isinstance(record["variant"], str)):  # fmt: skip
            raise ValueError("variant, chunk and prefix ids must be strings")
        if not (isinstance(inter, list) and len(inter) == len(prefix)
                and all(isinstance(x, (int, float)) and math.isfinite(x) for x in inter)):  # fmt: skip
            raise ValueError("inter must be one finite number per prefix chunk")
        if not isinstance(cci, (int, float)) or not 0.0 <= cci <= 1.0:
            raise ValueError("cci must be a number in [0, 1]")
        return cls(record["variant"], record["chunk"], tuple(prefix), tuple(float(x) for x in inter), float(cci))


class RequestVariants:
    """The request-made variants of one model's entries in one store, with their ``fr`` counts."""

    def __init__(self, log: RecordLog, model: str, per_chunk: int):
        self.log, self.model, self.per_chunk = log, model, check_craft_variants(per_chunk)
        self._by_key: dict[str, StoredVariant] = {}
        self._by_chunk: dict[str, dict[str, StoredVariant]] = {}  # the same variants by chunk id
        self.fr: dict[str, float] = {}
        self._offset = 0
        self._lock = threading.Lock()

    def of(self, chunk_id: str) -> list[StoredVariant]:
        """The chunk's variants as last read (``refresh`` reads what other processes listed since)."""
        with self._lock:
            return list(self._by_chunk.get(chunk_id, {}).values())

    def __len__(self) -> int:
        return len(self._by_key)

    def _list(self, variant: StoredVariant) -> None:
        self._by_key[variant.key] = variant
        self._by_chunk.setdefault(variant.chunk_id, {})[variant.key] = variant

    def _unlist(self, key: str) -> None:
        variant = self._by_key.pop(key, None)
        if variant is not None:
            chunk = self._by_chunk[variant.chunk_id]
            del chunk[key]
            if not chunk:
                del self._by_chunk[variant.chunk_id]

    def refresh(self) -> None:
        try:
            data = self.log.read_from(self._offset)
        except OSError as exc:
            logger.warning("cannot read %s (%s); request-made variants stay unknown here", self.log.name, exc)
            return
        with self._lock:
            self._offset += self._apply(data)

    def _apply(self, data: bytes) -> int:
        lines, consumed = whole_lines(data)
        for raw in lines:
            try:
                record = parse_line(raw)
                if "dropped" in record:
                    self._unlist(str(record["dropped"]))
                elif record.get("model") == self.model:
                    self._list(StoredVariant.from_json(record))
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("skipping a line of %s: %s", self.log.name, exc)
        return consumed

    def used(self, key: str, fix_overhead: float) -> None:
        """Count one access (the paper's fr += 1 / CFO)."""
        with self._lock:
            self.fr[key] = self.fr.get(key, 0.0) + 1.0 / max(fix_overhead, MIN_FIX_OVERHEAD)

    def add(self, variants: Sequence[StoredVariant], store) -> list[str]:
        """List ``variants`` (their entries are stored already); drop the lowest-``fr`` ones over the
        budget, entries first; returns the dropped keys."""
        if not variants:
            return []
        with self.log.appending() as session:
            with self._lock:
                self._offset += self._apply(session.read_from(self._offset))
                for variant in variants:
                    self._list(variant)
                excess = len(self._by_key) - self.per_chunk * len(self._by_chunk)
                fresh = {v.key for v in variants}
                # the lowest fr first; among equals the oldest (listed first), never one made just now
                victims = sorted((k for k in self._by_key if k not in fresh), key=lambda k: self.fr.get(k, 0.0))
                dropped = victims[: max(excess, 0)]
                for key in dropped:
                    self._unlist(key)
                    self.fr.pop(key, None)
                lines = [v.to_json(self.model) for v in variants] + [json.dumps({"dropped": k}) for k in dropped]
            for key in dropped:
                store.delete(key)
            self._offset = session.append("".join(line + "\n" for line in lines).encode())
        return dropped


class VariantRecorder(LayerHook):
    """Inter/intra attention of the rows a sparse prefill computes for chosen chunks (a ``LayerHook``).

    ``targets``: for each chunk to record, its slot span and the spans of the chunks in front of
    it (its prefix, in prompt order). At every layer each target's computed rows give that layer's
    a (length-normalised attention to the prefix chunks) and b (to its own tokens), and each row's
    attention to the prefix chunks adds to that slot's total (its rank in the token order)."""

    def __init__(self, spans: Sequence[tuple[int, int]], targets: Sequence[int]):
        self.spans = list(spans)  # every chunk's slots, prompt order
        self.targets = list(targets)  # indices into spans
        self.a = {t: [] for t in self.targets}
        self.b = {t: [] for t in self.targets}
        self.inter = {t: torch.zeros(t, dtype=torch.float64) for t in self.targets}
        self.outside: torch.Tensor | None = None  # per slot: attention to its chunk's prefix chunks, all layers
        self.computed: torch.Tensor | None = None  # per slot: computed by the prefill (at some layer)

    def after_write(self, layer: int, q: torch.Tensor, cache, step) -> None:
        inside = [(t, (step.slots >= self.spans[t][0]) & (step.slots < self.spans[t][1])) for t in self.targets]
        rows = torch.zeros_like(step.slots, dtype=torch.bool)
        for _, mask in inside:
            rows |= mask
        if not bool(rows.any()):
            return
        sub = SimpleNamespace(slots=step.slots[rows], positions=step.positions[rows])
        mass = span_attention(q[:, rows], cache, layer, sub, self.spans).mean(dim=0).double().cpu()  # [n, chunks]
        slots = sub.slots.cpu()
        if self.outside is None:
            self.outside = torch.zeros(cache.keys.shape[2], dtype=torch.float64)
            self.computed = torch.zeros(cache.keys.shape[2], dtype=torch.bool)
        for t, mask in inside:
            picked = mask[rows].cpu()
            n = int(picked.sum())
            if n == 0:
                continue
            own = mass[picked]
            sizes = torch.tensor([e - s for s, e in self.spans[:t]], dtype=torch.float64)
            prefix = own[:, :t]
            self.inter[t] += prefix.sum(dim=0)
            self.a[t].append(float((prefix.sum(dim=0) / (n * sizes)).sum()) if t else 0.0)
            self.b[t].append(float(own[:, t].sum()) / n**2)
            self.outside[slots[picked]] += prefix.sum(dim=1)
            self.computed[slots[picked]] = True

    def notes(self, target: int, prefix: Sequence[str], served_order: Sequence[int]) -> VariantNotes:
        """The target chunk's notes; tokens it computed first (most attention out first), then the
        others in ``served_order`` (the serving variant's ranking; () = chunk order)."""
        start, end = self.spans[target]
        a, b = self.a[target], self.b[target]
        a_mean, b_mean = sum(a) / max(len(a), 1), sum(b) / max(len(b), 1)
        cci = 1.0 / (1.0 + math.exp(-a_mean / b_mean)) if b_mean > 0 else 1.0
        computed: list[int] = []
        if self.computed is not None:
            rows = torch.nonzero(self.computed[start:end]).flatten()
            ranked = torch.argsort(self.outside[start:end][rows], descending=True, stable=True)
            computed = rows[ranked].tolist()
        done = set(computed)
        rest = [i for i in (served_order or range(end - start)) if i not in done]
        return VariantNotes(tuple(prefix), tuple(self.inter[target].tolist()), cci, tuple(computed + rest))


def recorder_for(segments: Sequence, chunk_spans: Sequence[tuple[int, int]], head_dim: int) -> VariantRecorder | None:
    """The recorder of the chunk ``segments`` (with ``start``/``end`` slots) that get new variants;
    None when there are none, or more chunks than one attention call per layer can measure."""
    spans = list(chunk_spans)
    if not segments or len(spans) > head_dim:
        return None
    return VariantRecorder(spans, [spans.index((seg.start, seg.end)) for seg in segments])


def store_variants(model: DecoderLM, entry_store: EntryStore, index: RequestVariants, new_variants: Sequence,
                   cache: KVCache, recorder: VariantRecorder) -> int:  # fmt: skip
    """After a request's prefill: each ``(segment, prefix, served_order)`` of ``new_variants`` stored
    as ``cache`` holds it (keys back to position-free) with its notes, and listed; returns how many."""
    made = []
    for segment, prefix, served_order in new_variants:
        notes = recorder.notes(recorder.spans.index((segment.start, segment.end)), prefix, served_order)
        keys, values = position_free_kv(model, cache, segment.start, segment.end)
        key = entry_store.keys.request_key(segment.token_ids, prefix)
        entry = KVEntry(tuple(segment.token_ids), keys.contiguous(), values.clone(),
                        entry_store.keys.meta("request", prefix=list(prefix), craft=notes.to_meta()))  # fmt: skip
        if entry_store.put_keyed(key, entry_store.as_stored(entry)):
            made.append(StoredVariant(key, segment.chunk_id, prefix, notes.inter, notes.cci))
    index.add(made, entry_store.store)
    return len(made)
