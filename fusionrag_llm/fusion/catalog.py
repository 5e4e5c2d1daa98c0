"""The registered chunks (texts, token ids, embeddings in FAISS) and the neighbours of their fused entries.

The catalog is the store's record log ``catalog.jsonl`` (``TieredStore.record_log``), so it travels
with the store: with a folder, a file there, one JSON record a line, shared by every process that
opens the store and appended under an exclusive ``flock``; without one, kept in memory by the store
object, shared by every engine on it:

* ``{"text", "vector"}`` registers a chunk. A process appends new texts only after reading, under
  the same lock, what others appended, so its catalog is always a prefix of the file: every process
  numbers the chunks alike and finds the same neighbours.
* ``{"fused", "chunk", "count", "requested", "neighbours", "view", "floor"}`` says which neighbours
  the fused entry stored under key ``fused`` was computed after, so ingestion can tell stale fused
  entries (their chunk has closer chunks now) without reading the entries (megabytes each).

``refresh`` reads only the bytes appended since the last read, under a shared lock. A line that is
not UTF-8, not JSON or not a valid record is skipped with a warning naming its line number: one bad
byte must not hide every chunk. A torn last line (a writer killed mid-write) stays unread until a
newline ends it; the next writer ends it first, so its own lines stay whole. A store folder that
cannot be written (read-only mount, permissions) can still be opened and queried; registering new
chunks in it raises ``CatalogWriteError`` naming the folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from fusionrag_llm.fusion.chunk_finder import ChunkFinder
from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.jsonl import parse_line, whole_lines, why_unreadable, write_problem
from fusionrag_llm.fusion.neighbours import NeighbourIndex
from fusionrag_llm.storage import AppendSession, FileRecordLog, MemoryRecordLog, RecordLog

logger = logging.getLogger(__name__)
TokenIds = tuple[int, ...]
CATALOG_FILE = "catalog.jsonl"
SIMILARITY_SLACK = 1e-4  # numpy's and FAISS's float32 inner products differ in the last bits


TENANT_CATALOGS = "catalog.t-*.jsonl"  # the catalogs of tenants other than the default one, in a store folder


def catalog_file(tenant: str) -> str:
    """The record log of ``tenant``'s chunks: ``catalog.jsonl`` for the default tenant (``""``), else one
    named by a hash of the tenant, so registering under one tenant never adds to another's catalog.

    >>> catalog_file(""), catalog_file("acme")
    ('catalog.jsonl', 'catalog.t-822b33ad87c148a0a20a5ba7cd5ebcaa.jsonl')
    """
    return tenant_file("catalog", tenant)


def tenant_file(name: str, tenant: str) -> str:
    """``name.jsonl`` for the default tenant (``""``), else ``name.t-<hash of the tenant>.jsonl``: a store
    file of one tenant, whose name tells nothing of the tenant and cannot leave the folder."""
    if not tenant:
        return f"{name}.jsonl"
    return f"{name}.t-{hashlib.sha256(tenant.encode()).hexdigest()[:32]}.jsonl"


def chunk_id_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class CatalogWriteError(FusionRAGError):
    """The chunk catalog could not be appended to (read-only store, permissions, full disk)."""


@dataclass(frozen=True)
class RegisteredChunk:
    chunk_id: str
    text: str
    token_ids: TokenIds
    space: int  # embedding dimension: chunks are only compared with chunks embedded the same way
    row: int  # row in that space's neighbour index


@dataclass(frozen=True)
class Neighbourhood:
    """A chunk's most similar other chunks, as one view of the catalog saw them."""

    chunks: tuple[RegisteredChunk, ...]  # most similar first
    count: int  # how many were asked for
    view: int  # chunks in the embedding space when searched
    floor: float | None  # similarity of the least similar one; None when fewer than ``count`` exist

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(chunk.chunk_id for chunk in self.chunks)


@dataclass(frozen=True)
class FusedRecord:
    """The neighbours the fused entry stored under ``key`` was computed after."""

    key: str  # the fused entry's store key (model, S0, chunk tokens, variant)
    chunk_id: str
    count: int
    requested: tuple[str, ...]  # the neighbour ids searched, most similar first
    neighbours: tuple[str, ...]  # those it was computed after (the context window may drop the last)
    view: int
    floor: float | None
    notes: bool = False  # the entry carries Cache-Craft's notes (``fusion/craft.py``)

    def to_json(self) -> str:
        return json.dumps({"fused": self.key, "chunk": self.chunk_id, "count": self.count,
                           "requested": list(self.requested), "neighbours": list(self.neighbours),
                           "view": self.view, "floor": self.floor, "notes": self.notes})  # fmt: skip

    @classmethod
    def from_json(cls, record: dict) -> FusedRecord:
        ids = (record["requested"], record["neighbours"])
        if not all(isinstance(group, list) and all(isinstance(i, str) for i in group) for group in ids):
            raise ValueError("neighbour ids must be lists of strings")
        floor = record["floor"]
        if floor is not None and not (isinstance(floor, (int, float)) and math.isfinite(floor)):
            raise ValueError("floor must be a number or null")
        count, view = record["count"], record["view"]
        if not all(isinstance(n, int) and n >= 0 for n in (count, view)) or not isinstance(record["chunk"], str):
            raise ValueError("count and view must be ints >= 0, chunk a string")
        notes = record.get("notes", False)  # records written before notes existed have none
        if not isinstance(notes, bool):
            raise ValueError("notes must be true or false")
        return cls(record["fused"], record["chunk"], count, tuple(ids[0]), tuple(ids[1]), view, floor, notes)


class ChunkCatalog:
    """Registered chunks by text and id, their neighbour indexes, and the fused entries' records.

    ``folder``: where ``catalog.jsonl`` lives (None: this process only). ``encode``: the model's
    tokenizer, for the token ids of chunks read from the file.
    """

    def __init__(self, log: RecordLog | Path | str | None = None,
                 encode: Callable[[str], list[int]] | None = None) -> None:  # fmt: skip
        self._by_text: dict[str, RegisteredChunk] = {}
        self._by_id: dict[str, RegisteredChunk] = {}
        self._rows: dict[int, list[RegisteredChunk]] = {}  # per embedding space
        self._spaces: dict[int, NeighbourIndex] = {}
        self._fused: dict[str, FusedRecord] = {}  # by entry key; the log's last record wins
        self.finder = ChunkFinder()
        self.log = _as_log(log)
        self.path = self.log.path  # the file, for a store with a folder
        self._encode = encode
        self._offset = 0  # bytes of the log read so far: whole lines only
        self._lines = 0  # lines read so far, to name bad lines in warnings
        self.refresh()

    def __len__(self) -> int:
        return len(self._by_text)

    def get(self, text: str) -> RegisteredChunk | None:
        return self._by_text.get(text)

    def by_id(self, chunk_id: str) -> RegisteredChunk | None:
        return self._by_id.get(chunk_id)

    def chunk_ids(self) -> list[str]:
        """The registered chunks' ids, in registration order."""
        return list(self._by_id)

    def fused_record(self, key: str) -> FusedRecord | None:
        return self._fused.get(key)

    def fused_records(self) -> list[FusedRecord]:
        return list(self._fused.values())

    # ------------------------------------------------------------------ reading
    def refresh(self) -> None:
        """Read what other processes (or engines on the same store) appended since the last read."""
        try:
            self._read_new(self.log.read_from(self._offset))
        except OSError as exc:  # unreadable: queries still work, without finding these chunks
            logger.warning("cannot read the chunk catalog %s (%s); its chunks stay unknown here", self._where, exc)

    def _read_new(self, data: bytes) -> None:
        lines, consumed = whole_lines(data)
        pending: dict[str, np.ndarray] = {}  # new chunks' vectors by text, in log order
        for raw in lines:
            self._lines += 1
            self._apply(raw, pending)
        self._offset += consumed
        encode = self._encode or _no_token_ids
        for space in dict.fromkeys(vector.shape[0] for vector in pending.values()):
            texts = [text for text, vector in pending.items() if vector.shape[0] == space]
            self._register(texts, [tuple(encode(text)) for text in texts], np.stack([pending[t] for t in texts]))

    @property
    def _where(self) -> str:
        return str(self.path) if self.path is not None else f"{self.log.name} (in memory)"

    def _apply(self, raw: bytes, pending: dict[str, np.ndarray]) -> None:
        if not raw.strip():
            return
        try:
            record = parse_line(raw)
            if "fused" in record:
                fused = FusedRecord.from_json(record)
                self._fused[fused.key] = fused
                return
            text, vector = _chunk_record(record)
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("skipping line %d of %s: %s", self._lines, self._where, why_unreadable(exc))
            return
        if text not in self._by_text:
            pending.setdefault(text, vector)  # the first registration of a text wins

    # ------------------------------------------------------------------ registering
    def add(self, texts: list[str], token_ids: list[TokenIds], vectors: np.ndarray,
            persist: bool = True) -> list[RegisteredChunk]:  # fmt: skip
        """Register ``texts`` with their normalised embeddings [len(texts), dim]; returns their chunks.

        A text another process registered meanwhile keeps that registration (and its vector).
        """
        if not persist:
            self._register(*_unknown(self._by_text, texts, token_ids, vectors))
            return [self._by_text[text] for text in texts]
        with self._appending() as session:
            self._read_new(session.read_from(self._offset))
            fresh_texts, fresh_ids, fresh_vectors = _unknown(self._by_text, texts, token_ids, vectors)
            lines = [json.dumps({"text": t, "vector": v.tolist()}) for t, v in zip(fresh_texts, fresh_vectors)]
            self._append(session, lines)
            self._register(fresh_texts, fresh_ids, fresh_vectors)
        return [self._by_text[text] for text in texts]

    def record_fused(self, record: FusedRecord) -> None:
        """Remember (in the log) which neighbours a fused entry was computed after."""
        with self._appending() as session:
            self._read_new(session.read_from(self._offset))
            self._append(session, [record.to_json()])
        self._fused[record.key] = record

    def _register(self, texts: list[str], token_ids: list[TokenIds], vectors: np.ndarray) -> None:
        if not texts:
            return
        space = int(vectors.shape[1])
        rows = self._rows.setdefault(space, [])
        for text, ids in zip(texts, token_ids):
            chunk = RegisteredChunk(chunk_id_of(text), text, tuple(ids), space=space, row=len(rows))
            rows.append(chunk)
            self._by_text[text] = self._by_id[chunk.chunk_id] = chunk
        self._spaces.setdefault(space, NeighbourIndex()).add(vectors)
        self.finder.register(texts)

    @contextmanager
    def _appending(self) -> Iterator[AppendSession]:
        try:
            with self.log.appending() as session:
                yield session
        except CatalogWriteError:
            raise
        except OSError as exc:
            raise self._write_error(exc) from exc

    def _append(self, session: AppendSession, lines: list[str]) -> None:
        """Append ``lines``; the caller has read the log to its last whole line in the same session."""
        if not lines:
            return
        data = "".join(line + "\n" for line in lines).encode()
        try:
            end = session.append(data)
        except OSError as exc:
            raise self._write_error(exc) from exc
        # the log may have ended a torn line first: everything up to ``end`` is whole lines we know
        self._offset, self._lines = end, self._lines + data.count(b"\n")

    def _write_error(self, exc: OSError) -> CatalogWriteError:
        problem = write_problem(exc)
        return CatalogWriteError(
            f"cannot write the chunk catalog {self.log.name} in the store folder {self.path.parent if self.path else '(memory)'}: "
            f"{problem} ({exc}). A store that cannot be written can still be opened and queried; to "
            "register chunks, use a writable store folder (store=...), or free space and run again."
        )

    # ------------------------------------------------------------------ neighbours
    def neighbourhood(self, chunk: RegisteredChunk, count: int) -> Neighbourhood:
        """Up to ``count`` most similar other chunks of ``chunk``'s embedding space, most similar first."""
        index = self._spaces[chunk.space]
        (found,) = index.search([chunk.row], count)
        rows = self._rows[chunk.space]
        floor = found[-1][1] if found and len(found) == count else None
        return Neighbourhood(tuple(rows[row] for row, _ in found), count, len(index), floor)

    def may_have_changed(self, record: FusedRecord) -> bool:
        """Whether a chunk registered after ``record``'s view could be one of its neighbours now.

        Cheap and conservative (a vector product with the later chunks only, never a full search):
        False means the record's neighbours are certainly still the current ones.
        """
        chunk = self._by_id.get(record.chunk_id)
        if chunk is None or record.count == 0:
            return False
        index = self._spaces[chunk.space]
        if len(index) <= record.view:
            return False
        if record.floor is None:  # fewer than ``count`` neighbours: any later chunk joins them
            return True
        later = index.vectors(record.view, len(index))  # [later chunks, dim]
        return float((later @ index.vector(chunk.row)).max()) >= record.floor - SIMILARITY_SLACK


def _as_log(log: RecordLog | Path | str | None) -> RecordLog:
    if log is None:
        return MemoryRecordLog(CATALOG_FILE)
    if isinstance(log, (str, Path)):
        return FileRecordLog(Path(log), CATALOG_FILE)
    return log


def registered_chunk_count(folder: Path) -> int:
    """How many chunks the catalog in ``folder`` registers (bad lines skipped, duplicates counted once)."""
    return len(ChunkCatalog(folder))


def _chunk_record(record: dict) -> tuple[str, np.ndarray]:
    text, vector = record["text"], np.asarray(record["vector"], dtype=np.float32)
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the text must be a non-empty string")
    if vector.ndim != 1 or not vector.size or not np.isfinite(vector).all():
        raise ValueError("the vector must be a non-empty list of finite numbers")
    return text, vector


def _unknown(known: dict, texts: list[str], token_ids: list[TokenIds], vectors: np.ndarray):
    """The texts (with their token ids and vectors) that ``known`` lacks, first occurrences only."""
    rows: list[int] = []
    seen: set[str] = set()
    for row, text in enumerate(texts):
        if text not in known and text not in seen:
            seen.add(text)
            rows.append(row)
    return [texts[r] for r in rows], [token_ids[r] for r in rows], vectors[rows]


def _no_token_ids(text: str) -> TokenIds:
    return ()
