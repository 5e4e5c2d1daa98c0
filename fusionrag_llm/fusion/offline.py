"""The offline stage: plain entries, embeddings and FAISS neighbours, fused entries (docs/methods.md).

Idempotent: entries are keyed by content and each fused entry's neighbours are recorded in the
catalog, so a second call with the same texts computes nothing. Plain entries of all chunks exist
before any chunk is fused (two passes).

Several processes may ingest into one store at once, and must leave the fused entries that one
process ingesting everything would. A fused entry depends on every chunk in the store (its
neighbours are the most similar of them all), so:

* the catalog is re-read (only what was appended) before neighbours are searched, and new chunks
  are registered under its lock, so all processes number the chunks alike;
* each fused entry stored is followed by a catalog record of the neighbours it was computed after;
  the catalog is then re-read, and the entry computed again if its neighbours changed meanwhile
  (another process registered a closer chunk while this one computed, and may already have
  refreshed the entry: without this the older view could be written last);
* at the end, this model's fused entries whose record is stale (their chunk has closer chunks now,
  whoever registered them) are computed again. Fused entries are computed only for chunks this
  call was given or whose record is stale. ``fuse=False`` calls register without refreshing; the
  next fused ingestion does it.
The last process to write an entry thus wrote it from a view in which its neighbours were final.

``pause`` is called between pieces of the work (one entry each, or one chunk's fusing): the caller
may let other work of its process run there (``FusionRAG.add_chunks`` releases the engine lock, so
requests keep stepping). What runs there sees the catalog and the store as another process would.

On the CPU, entries are computed one chunk per forward pass: batched passes differ in the last bits
(~1e-6, measured) with the batch's make-up, and an entry must have the same bits whichever process,
batch or online miss computed it, or the fused entries computed after it would differ too. On a GPU,
where one chunk per forward leaves the card waiting for kernel launches, plain entries are computed
PLAIN_BATCH and fused entries FUSED_BATCH per forward: equal to one per forward up to float rounding
(every process reads the plain entries the store holds, so its fused entries start from the same
bits unless a plain entry was dropped and computed again).

Writes to a store folder are checked (``persist=True``): a failed write (full disk, read-only
store) stops ingestion with one ``IngestionWriteError`` saying what was kept; a re-run resumes.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from tqdm.auto import tqdm

from fusionrag_llm.errors import FusionRAGError, PromptTooLongError
from fusionrag_llm.fusion.craft import META_KEY
from fusionrag_llm.fusion.catalog import (CatalogWriteError, ChunkCatalog, FusedRecord, Neighbourhood,
                                          RegisteredChunk, chunk_id_of)  # fmt: skip
from fusionrag_llm.fusion.entry_compute import EntryComputer
from fusionrag_llm.fusion.entry_keys import EntryKeys
from fusionrag_llm.fusion.entry_store import EntryStore
from fusionrag_llm.fusion.embeddings import Embedder, default_embedder, normalized
from fusionrag_llm.storage import KVEntry, StoreWriteError

logger = logging.getLogger(__name__)
MAX_RECOMPUTES = 100  # of one fused entry while other processes keep registering closer chunks
FUSED_BATCH = 8  # fused entries computed in one forward on a GPU
PLAIN_BATCH = 8  # plain entries computed in one forward on a GPU


class IngestReport(list):
    """The chunk ids an ingestion registered, in the order of its texts, and what it computed.

    A list, so ``ids = rag.add_chunks(texts)`` reads as the ids; the counts are attributes.

        >>> report = IngestReport(["a", "b"], plain_computed=2)
        >>> report == ["a", "b"], report.chunk_ids, report.plain_computed, report.fused_computed
        (True, ['a', 'b'], 2, 0)
    """

    def __init__(self, chunk_ids=(), plain_computed: int = 0, fused_computed: int = 0, seconds: dict | None = None):
        super().__init__(chunk_ids)
        self.plain_computed = plain_computed
        self.fused_computed = fused_computed  # includes stale fused entries of other chunks refreshed by this call
        self.seconds = {} if seconds is None else seconds  # per stage, where the caller timed them
        self.evicted = 0  # chunks whose entries the store dropped before the call ended (too small a store)

    @property
    def chunk_ids(self) -> list[str]:
        return list(self)

    def __repr__(self) -> str:
        return (f"IngestReport({list(self)!r}, plain_computed={self.plain_computed}, "
                f"fused_computed={self.fused_computed})")  # fmt: skip


class IngestionWriteError(FusionRAGError):
    """The store or its catalog could not be written during ingestion; what was written is kept.

    ``directory``: the store folder; ``cause``: the write error; ``report``: what this call stored.
    """

    def __init__(self, directory: Path | None, cause: BaseException, report: IngestReport):
        self.directory, self.cause, self.report = directory, cause, report
        super().__init__(
            f"ingestion stopped: the KV store at {directory} could not be written ({cause}). "
            f"{report.plain_computed} plain and {report.fused_computed} fused entries of this call were "
            "stored and are kept; free space (or use a writable store folder) and run the same call "
            "again to resume where it stopped."
        )

    def __reduce__(self):  # pickled whole: a worker process (``engine/ray_ingest.py``) raises it to the caller
        return type(self), (self.directory, self.cause, self.report)


def validate_neighbors(neighbors: int) -> int:
    if isinstance(neighbors, bool) or not isinstance(neighbors, int) or neighbors < 0:
        raise FusionRAGError(f"neighbors must be an int >= 0, got {neighbors!r}")
    return neighbors


def validate_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise FusionRAGError("texts must be a list of strings, not a single string")
    texts = list(texts)
    for index, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise FusionRAGError(f"texts[{index}] must be a non-empty string, got {text!r:.60}")
    return texts


def add_chunks(
    computer: EntryComputer,
    catalog: ChunkCatalog,
    encode,
    texts: Sequence[str],
    fuse: bool = True,
    neighbors: int = 10,
    embeddings=None,
    embedder: Embedder | None = None,
    progress: bool = True,
    variant_notes: bool = False,
    pause: Callable[[], None] | None = None,
) -> IngestReport:
    """Register ``texts`` as chunks and store their plain (and, with ``fuse``, fused) entries.

    ``variant_notes``: fused entries carry Cache-Craft's notes (what ``cache_craft`` reads); a stored
    fused entry without them is computed again with them. ``pause``: called between pieces of work."""
    texts = validate_texts(texts)
    validate_neighbors(neighbors)
    chunks = register_chunks(computer, catalog, encode, texts, embeddings, embedder)
    report = IngestReport(chunk_ids=[chunk_id_of(text) for text in texts])
    try:
        _ensure_plain(computer, chunks, report, progress, pause)
        if fuse:
            _ensure_fused(computer, catalog, chunks, neighbors, report, progress, variant_notes, pause)
    except (StoreWriteError, CatalogWriteError) as exc:
        raise wrap_write_errors(computer.entry_store, exc, report) from exc
    count_evicted(computer.entry_store, catalog, chunks, fuse, report)
    return report


def count_evicted(entry_store: EntryStore, catalog: ChunkCatalog, chunks: list[RegisteredChunk], fuse: bool,
                  report: IngestReport) -> None:  # fmt: skip
    """``report.evicted``: chunks of this ingestion whose plain entry, or (with ``fuse``) whose recorded
    fused entry, the store dropped before the call ended (a store too small for the call: later writes
    evicted them); a warning says so when there are any."""
    def fused_gone(chunk: RegisteredChunk) -> bool:
        recorded = catalog.fused_record(entry_store.keys.key(chunk.token_ids, "fused")) is not None
        return recorded and not entry_store.contains(chunk.token_ids, "fused")

    without_plain = {id(chunk) for chunk in missing_plain(entry_store, chunks)}
    report.evicted = sum(id(chunk) in without_plain or (fuse and fused_gone(chunk)) for chunk in chunks)
    if report.evicted:
        logger.warning(
            "the store no longer holds the entries of %d of the %d chunks just ingested: its budget is "
            "smaller than this ingestion needed, so requests will compute them again or be served plain "
            "entries for fused ones; use a store folder (store=...) or a larger budget",
            report.evicted, len(chunks),
        )  # fmt: skip


def register_chunks(computer: EntryComputer, catalog: ChunkCatalog, encode, texts: list[str], embeddings=None,
                    embedder: Embedder | None = None) -> list[RegisteredChunk]:  # fmt: skip
    """Register ``texts`` (validated) in the catalog, embedding the new ones; their chunks, each text once."""
    vectors = normalized(embeddings, len(texts)) if embeddings is not None else None
    unique = list(dict.fromkeys(texts))
    catalog.refresh()  # texts other processes registered are neither embedded nor registered again
    new_texts = [text for text in unique if catalog.get(text) is None]
    if new_texts:
        token_ids = [tuple(encode(text)) for text in new_texts]
        _check_window(computer, token_ids)
        if vectors is None:
            new_vectors = normalized((embedder or default_embedder())(new_texts), len(new_texts))
        else:
            first_row = {text: row for row, text in reversed(list(enumerate(texts)))}
            new_vectors = vectors[[first_row[text] for text in new_texts]]
        catalog.add(new_texts, token_ids, new_vectors)
    return [catalog.get(text) for text in unique]


def _check_window(computer: EntryComputer, token_ids: list[tuple[int, ...]]) -> None:
    window, s0_ids = computer.model.cfg.max_position_embeddings, computer.keys.s0_ids
    for ids in token_ids:
        if len(s0_ids) + len(ids) > window:
            raise PromptTooLongError(
                f"a chunk of {len(ids)} tokens does not fit the context window of {window} tokens "
                f"after the {len(s0_ids)}-token prefix; split it into smaller chunks"
            )


def wrap_write_errors(entry_store: EntryStore, exc: StoreWriteError | CatalogWriteError,
                      report: IngestReport) -> IngestionWriteError:  # fmt: skip
    directory = getattr(exc, "directory", None) or entry_store.store.directory
    return IngestionWriteError(directory, getattr(exc, "cause", None) or exc.__cause__ or exc, report)


def _put(entry_store: EntryStore, entry: KVEntry, variant: str) -> bool:
    # with a folder, a write that did not reach the disk must stop ingestion, not pass as stored
    return entry_store.put(entry, variant, persist=entry_store.store.directory is not None)


# ---------------------------------------------------------------------- plain entries
def missing_plain(entry_store: EntryStore, chunks: list[RegisteredChunk]) -> list[RegisteredChunk]:
    """The chunks whose plain entry is not stored (what a resumed ingestion still computes)."""
    return [c for c in chunks if not entry_store.contains(c.token_ids, "plain")]


def _ensure_plain(computer: EntryComputer, chunks: list[RegisteredChunk], report: IngestReport, progress: bool,
                  pause: Callable[[], None] | None = None) -> None:  # fmt: skip
    missing = missing_plain(computer.entry_store, chunks)
    size = plain_batch(computer.model)
    with tqdm(total=len(missing), desc="plain entries", unit="chunk", disable=not progress or not missing) as bar:
        for start in range(0, len(missing), size):
            group = missing[start : start + size]
            if pause is not None:
                pause()  # a request's miss may store some meanwhile
                group = [c for c in group if not computer.entry_store.contains(c.token_ids, "plain")]
            if group:
                store_plains(computer, group, report)
            bar.update(min(size, len(missing) - start))


def plain_batch(model) -> int:
    """Plain entries computed per forward: PLAIN_BATCH on a GPU, one on the CPU (module docstring)."""
    return PLAIN_BATCH if model.device.type == "cuda" else 1


def store_plain(computer: EntryComputer, chunk: RegisteredChunk, report: IngestReport) -> KVEntry:
    """Compute and store ``chunk``'s plain entry, alone in its forward (see the module docstring)."""
    return store_plains(computer, [chunk], report)[0]


def store_plains(computer: EntryComputer, chunks: list[RegisteredChunk], report: IngestReport) -> list[KVEntry]:
    """Compute the plain entries of ``chunks`` in one forward (where their tokens fit one) and store them."""
    ids = [chunk.token_ids for chunk in chunks]
    entries = computer.compute_plain(ids, max_batch_tokens=sum(map(len, ids)))
    stored = []
    for entry in entries:
        entry = computer.entry_store.as_stored(entry)  # fused neighbours read what the store holds
        _put(computer.entry_store, entry, "plain")
        report.plain_computed += 1
        stored.append(entry)
    return stored


def _plain_entry(computer: EntryComputer, chunk: RegisteredChunk, report: IngestReport) -> KVEntry:
    found = computer.entry_store.lookup(chunk.token_ids, "plain")
    # absent: registered by another process that has not stored it yet, or evicted from a bounded store
    return found[0] if found is not None else store_plain(computer, chunk, report)


# ---------------------------------------------------------------------- fused entries
def _ensure_fused(computer: EntryComputer, catalog: ChunkCatalog, chunks: list[RegisteredChunk], neighbors: int,
                  report: IngestReport, progress: bool, notes: bool = False,
                  pause: Callable[[], None] | None = None) -> None:  # fmt: skip
    catalog.refresh()
    size = fused_batch(computer.model)
    with tqdm(total=len(chunks), desc="fused entries", unit="chunk", disable=not progress) as bar:
        for start in range(0, len(chunks), size):
            if pause is not None:
                pause()
            group = chunks[start : start + size]
            if len(group) == 1:
                fuse_chunk(computer, catalog, group[0], neighbors, report, notes)
            else:
                fuse_chunks(computer, catalog, group, neighbors, report, notes)
            bar.update(len(group))
    _refresh_stale(computer, catalog, report, notes, pause)


def fuse_chunk(computer: EntryComputer, catalog: ChunkCatalog, chunk: RegisteredChunk, count: int,
               report: IngestReport, notes: bool = False) -> None:  # fmt: skip
    """Make ``chunk``'s fused entry the one its current ``count`` neighbours give (with notes if asked)."""
    near = catalog.neighbourhood(chunk, count)
    if _is_done(computer.entry_store, catalog, chunk, near, notes):
        return
    for _ in range(MAX_RECOMPUTES):
        _store_fused(computer, catalog, chunk, near, report, notes)
        catalog.refresh()
        latest = catalog.neighbourhood(chunk, count)
        if latest.ids == near.ids:
            return
        near = latest
    logger.warning("fused entry of chunk %s: its neighbours kept changing; the last process to fuse it refreshes it",
                   chunk.chunk_id)  # fmt: skip


def fused_batch(model) -> int:
    """Fused entries computed per forward: FUSED_BATCH on a GPU, one on the CPU (module docstring)."""
    return FUSED_BATCH if model.device.type == "cuda" else 1


def fuse_chunks(computer: EntryComputer, catalog: ChunkCatalog, chunks: list[RegisteredChunk], count: int,
                report: IngestReport, notes: bool = False) -> None:  # fmt: skip
    """``fuse_chunk`` of each of ``chunks``, the entries not current computed in one forward; one whose
    neighbours changed while they were computed goes through ``fuse_chunk`` again."""
    todo = []
    for chunk in chunks:
        near = catalog.neighbourhood(chunk, count)
        if not _is_done(computer.entry_store, catalog, chunk, near, notes):
            todo.append((chunk, near))
    if not todo:
        return
    jobs = [(chunk.token_ids, [_plain_entry(computer, n, report) for n in near.chunks], list(near.ids))
            for chunk, near in todo]  # fmt: skip
    for (chunk, near), entry in zip(todo, computer.compute_fused_many(jobs, notes)):
        _keep_fused(computer, catalog, chunk, near, entry, report)
        catalog.refresh()
        if catalog.neighbourhood(chunk, count).ids != near.ids:
            fuse_chunk(computer, catalog, chunk, count, report, notes)


def _is_done(entry_store: EntryStore, catalog: ChunkCatalog, chunk: RegisteredChunk, near: Neighbourhood,
             notes: bool) -> bool:  # fmt: skip
    """The chunk's fused entry is current for ``near`` (and has notes, if asked)."""
    return _is_current(entry_store, catalog, chunk, near) and (not notes or _has_notes(entry_store, catalog, chunk))


def _has_notes(entry_store: EntryStore, catalog: ChunkCatalog, chunk: RegisteredChunk) -> bool:
    """Whether the chunk's current fused entry carries notes, from its record (reading the entry only
    where a read-only store could not record it)."""
    record = catalog.fused_record(entry_store.keys.key(chunk.token_ids, "fused"))
    if record is not None:
        return record.notes
    found = entry_store.lookup(chunk.token_ids, "fused")
    return found is not None and META_KEY in found[0].meta


def _store_fused(computer: EntryComputer, catalog: ChunkCatalog, chunk: RegisteredChunk, near: Neighbourhood,
                 report: IngestReport, notes: bool = False) -> None:  # fmt: skip
    plain = [_plain_entry(computer, neighbour, report) for neighbour in near.chunks]
    _keep_fused(computer, catalog, chunk, near, computer.compute_fused(chunk.token_ids, plain, list(near.ids), notes=notes),
                report)  # fmt: skip


def _keep_fused(computer: EntryComputer, catalog: ChunkCatalog, chunk: RegisteredChunk, near: Neighbourhood,
                entry: KVEntry, report: IngestReport) -> None:  # fmt: skip
    """Store ``entry``, the chunk's fused entry computed after ``near``, and record it."""
    stored = _put(computer.entry_store, entry, "fused")
    report.fused_computed += 1
    if stored:  # a record of an entry the store refused would claim it current
        catalog.record_fused(_record(computer.keys, chunk, near, entry))


def _record(keys: EntryKeys, chunk: RegisteredChunk, near: Neighbourhood, entry: KVEntry) -> FusedRecord:
    """The record of ``entry``, the chunk's fused entry computed after ``near``."""
    key = keys.key(chunk.token_ids, "fused")
    used = tuple(entry.meta.get("neighbours", near.ids))
    return FusedRecord(key, chunk.chunk_id, near.count, near.ids, used, near.view, near.floor, META_KEY in entry.meta)


def _is_current(entry_store: EntryStore, catalog: ChunkCatalog, chunk: RegisteredChunk, near: Neighbourhood) -> bool:
    record = catalog.fused_record(entry_store.keys.key(chunk.token_ids, "fused"))
    if record is None:
        return _adopt_unrecorded(entry_store, catalog, chunk, near)
    if record.requested != near.ids or not entry_store.contains(chunk.token_ids, "fused"):
        return False
    if record.count != near.count:  # same neighbours asked differently: later refreshes use the new count
        _record_if_writable(catalog, replace(record, count=near.count, view=near.view, floor=near.floor))
    return True


def _adopt_unrecorded(entry_store: EntryStore, catalog: ChunkCatalog, chunk: RegisteredChunk,
                      near: Neighbourhood) -> bool:  # fmt: skip
    """A fused entry stored before records existed: current if it was computed after ``near``."""
    found = entry_store.lookup(chunk.token_ids, "fused")
    if found is None or list(found[0].meta.get("requested", ())) != list(near.ids):
        return False
    # recorded from now on, so that later ingestions can tell when it goes stale
    _record_if_writable(catalog, _record(entry_store.keys, chunk, near, found[0]))
    return True


def _record_if_writable(catalog: ChunkCatalog, record: FusedRecord) -> None:
    """Update a record of an entry that is already right: a read-only store answers without it."""
    try:
        catalog.record_fused(record)
    except CatalogWriteError as exc:
        logger.debug("the record of fused entry %s is not updated: %s", record.key, exc)


def _refresh_stale(computer: EntryComputer, catalog: ChunkCatalog, report: IngestReport, notes: bool = False,
                   pause: Callable[[], None] | None = None) -> None:  # fmt: skip
    """Fuse again this model's chunks whose recorded neighbours are no longer their nearest."""
    for chunk, count in stale_chunks(computer.keys, catalog):
        if pause is not None:
            pause()
        fuse_chunk(computer, catalog, chunk, count, report, notes)


def stale_chunks(keys: EntryKeys, catalog: ChunkCatalog) -> list[tuple[RegisteredChunk, int]]:
    """This model's chunks whose fused entry's recorded neighbours are no longer their nearest, each
    with the neighbour count it was fused with (a cheap check first, a search only where it may be)."""
    catalog.refresh()
    stale = []
    for record in catalog.fused_records():
        chunk = catalog.by_id(record.chunk_id)
        if chunk is None or not catalog.may_have_changed(record):
            continue
        if keys.key(chunk.token_ids, "fused") != record.key:
            continue  # another model's (or prefix's) entry of this chunk
        if catalog.neighbourhood(chunk, record.count).ids != record.requested:
            stale.append((chunk, record.count))
    return stale
