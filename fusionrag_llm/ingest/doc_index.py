"""The retrieval index of ``fusionrag ingest``: chunks' text, source and vector in the store's record
log ``documents.jsonl``, searched with FAISS.

The log travels with the store (``TieredStore.record_log``): with a folder, a file there, shared by
every process that opens the store; without one (``":memory:"``), kept by the store object and
shared by every engine on it. Records, one JSON object a line:

* ``{"meta": {"model", "model_fingerprint", "embedding", "dim"}}``: the model and embedding space
  the index is for; the first one wins and every later writer is checked against it.
* ``{"text", "source", "vector"}``: one chunk. A writer appends only texts that are not in the log
  after reading, under the log's lock, what others appended, so every process numbers chunks alike.

A bad line (not UTF-8, not JSON, a field missing, a vector of the wrong size) is skipped with a
warning naming it; a torn last line never swallows the next append. The FAISS index (exact inner
product) is built in memory from the vectors when first searched and extended as chunks arrive.

Stores written before the log existed kept the index as files in ``<store>/documents/``
(``meta.json``, ``chunks.jsonl``, ``index.faiss``). Opening such a store moves their records into
the log and then removes the folder; a store that cannot be written is searched from the folder.
Like every file of a store, those are read without following a link: a ``documents`` folder or a
file in it that is a link is not read (the store folder is untrusted).
"""

from __future__ import annotations

import json
import logging
import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from fusionrag_llm.errors import FusionRAGError, require
from fusionrag_llm.fusion.catalog import tenant_file
from fusionrag_llm.fusion.jsonl import parse_line, whole_lines, why_unreadable, write_problem
from fusionrag_llm.storage import AppendSession, RecordLog, read_file_in

logger = logging.getLogger(__name__)
DOCUMENTS_LOG = "documents.jsonl"  # the record log of the retrieval index (the default tenant's)
TENANT_DOCUMENTS = "documents.t-*.jsonl"  # the retrieval indexes of other tenants (``documents_file``)
LEGACY_FOLDER = "documents"  # where stores written before the log kept it


def documents_file(tenant: str) -> str:
    """The record log of ``tenant``'s retrieval index: ``documents.jsonl`` for the default tenant (``""``),
    else one named by a hash of the tenant, so one tenant's ingestion is never retrieved for another."""
    return tenant_file("documents", tenant)


def _faiss() -> Any:
    """FAISS, imported on first use (an optional dependency)."""
    return require("faiss", "embed", "the document index")


class DocumentIndexWriteError(FusionRAGError):
    """The document index's log could not be written (read-only store, full disk)."""


@dataclass(frozen=True)
class IndexMeta:
    model: str  # the LLM whose KV entries were stored alongside
    model_fingerprint: str
    embedding: str  # the embedding model (or "given")
    dim: int

    @classmethod
    def from_json(cls, record: Any) -> IndexMeta:
        if not isinstance(record, dict):
            raise ValueError("meta must be an object")
        meta = cls(**{name: record[name] for name in ("model", "model_fingerprint", "embedding", "dim")})
        if not all(isinstance(v, str) for v in (meta.model, meta.model_fingerprint, meta.embedding)):
            raise ValueError("model, model_fingerprint and embedding must be strings")
        if not isinstance(meta.dim, int) or meta.dim <= 0:
            raise ValueError("dim must be a positive integer")
        return meta


class DocumentIndex:
    """The chunks of one store's retrieval index. ``legacy``: the old-layout folder to migrate from."""

    def __init__(self, log: RecordLog, legacy: Path | None = None):
        self.log = log
        self.texts: list[str] = []
        self.sources: list[str] = []
        self._vectors: list[np.ndarray] = []
        self._rows: dict[str, int] = {}
        self.meta: IndexMeta | None = None
        self._index: Any = None  # a faiss.IndexFlatIP over the first ``_index.ntotal`` vectors
        self._offset = 0  # bytes of the log read so far: whole lines only
        self._lines = 0  # lines read so far, to name bad lines in warnings
        self.refresh()
        legacy = None if legacy is None else Path(legacy)
        if legacy is not None and self.meta is None and not self.texts and _is_real_folder(legacy):
            self._migrate(legacy)

    def __len__(self) -> int:
        return len(self.texts)

    def __contains__(self, text: str) -> bool:
        return text in self._rows

    @property
    def where(self) -> str:
        return str(self.log.path) if self.log.path is not None else f"{self.log.name} (in memory)"

    def refresh(self) -> None:
        """Read what other processes (or engines on the same store) appended since the last read."""
        self._offset += self._read(self.log.read_from(self._offset), self.where)

    def check_meta(self, meta: IndexMeta) -> None:
        """Record ``meta`` in an index that has none; refuse to mix models or embedding spaces."""
        if self.meta is None:
            with self._appending() as session:
                self._catch_up(session)
                if self.meta is None:
                    self._append(session, [json.dumps({"meta": asdict(meta)})])
        if self.meta.model_fingerprint != meta.model_fingerprint and self.meta.model == meta.model:
            raise FusionRAGError(  # the storage fingerprint also names the compute dtype and the KV codec
                f"the document index {self.where} was built with model {meta.model!r} under another --dtype or "
                "kv_codec (--engine-option kv_codec=); give the ones it was ingested with or use another --store"
            )
        if self.meta.model_fingerprint != meta.model_fingerprint:
            raise FusionRAGError(
                f"the document index {self.where} was built with model {self.meta.model!r}, not {meta.model!r}; "
                f"pass --model {self.meta.model} or use another --store"
            )
        if (self.meta.embedding, self.meta.dim) != (meta.embedding, meta.dim):
            raise FusionRAGError(f"the document index {self.where} uses embeddings {self.meta.embedding!r} ({self.meta.dim}-d)")

    def add(self, texts: list[str], sources: list[str], vectors: np.ndarray) -> None:
        """Append the chunks whose texts the index lacks (the first source of a text wins)."""
        with self._appending() as session:
            self._catch_up(session)
            seen: set[str] = set()
            lines = []
            for text, source, vector in zip(texts, sources, vectors):
                if text not in self._rows and text not in seen:
                    seen.add(text)
                    lines.append(json.dumps({"text": text, "source": source, "vector": np.asarray(vector).tolist()}))
            self._append(session, lines)

    def vector_of(self, text: str) -> np.ndarray:
        return self._vectors[self._rows[text]]

    def search(self, vector: np.ndarray, k: int) -> list[tuple[str, str, float]]:
        """(text, source, score) of the k most similar chunks, best first."""
        if not self.texts:
            raise FusionRAGError(f"the document index {self.where} is empty; run 'fusionrag ingest PATH' first")
        if self._index is None:
            self._index = _faiss().IndexFlatIP(len(self._vectors[0]))
        if self._index.ntotal < len(self._vectors):
            self._index.add(np.stack(self._vectors[self._index.ntotal :]))
        scores, rows = self._index.search(np.asarray(vector, dtype=np.float32)[None], min(k, len(self.texts)))
        return [(self.texts[r], self.sources[r], float(s)) for r, s in zip(rows[0], scores[0]) if r >= 0]

    # ------------------------------------------------------------------ the log
    @contextmanager
    def _appending(self) -> Iterator[AppendSession]:
        try:
            with self.log.appending() as session:
                yield session
        except OSError as exc:
            raise DocumentIndexWriteError(
                f"cannot write the document index {self.where}: {write_problem(exc)} ({exc}). A store that "
                "cannot be written can still be queried; to ingest, use a writable store folder."
            ) from exc

    def _catch_up(self, session: AppendSession) -> None:
        self._offset += self._read(session.read_from(self._offset), self.where)

    def _append(self, session: AppendSession, lines: list[str]) -> None:
        """Append ``lines`` after what the caller has read in ``session``, then take them in."""
        if lines:
            session.append("".join(line + "\n" for line in lines).encode())
            self._catch_up(session)  # the log may have ended a torn line first: read back what is there

    def _read(self, data: bytes, where: str) -> int:
        """Take in the whole lines of ``data``; returns how many bytes they span."""
        lines, consumed = whole_lines(data)
        for raw in lines:
            self._lines += 1
            if raw.strip():
                try:
                    self._apply(parse_line(raw))
                except (ValueError, KeyError, TypeError) as exc:
                    logger.warning("skipping line %d of %s: %s", self._lines, where, why_unreadable(exc))
        return consumed

    def _apply(self, record: dict) -> None:
        if "meta" in record:
            meta = IndexMeta.from_json(record["meta"])
            self.meta = self.meta or meta  # the first one wins
            return
        text, source, vector = record["text"], record["source"], np.asarray(record["vector"], dtype=np.float32)
        if not isinstance(text, str) or not text or not isinstance(source, str):
            raise ValueError("text must be a non-empty string and source a string")
        if vector.ndim != 1 or not vector.size or not np.isfinite(vector).all():
            raise ValueError("the vector must be a non-empty list of finite numbers")
        dim = self.meta.dim if self.meta else len(self._vectors[0]) if self._vectors else vector.size
        if vector.size != dim:
            raise ValueError(f"the vector has {vector.size} numbers, the index {dim}")
        if text not in self._rows:
            self._rows[text] = len(self.texts)
            self.texts.append(text)
            self.sources.append(source)
            self._vectors.append(vector)

    # ------------------------------------------------------------------ the old layout
    def _migrate(self, folder: Path) -> None:
        """Move an old-layout index into the log (once, under its lock), then remove the folder."""
        try:
            with self.log.appending() as session:
                self._catch_up(session)
                if self.meta is not None or self.texts:
                    return  # another process moved it meanwhile
                data = _legacy_records(folder)
                if data:
                    session.append(data)
                    self._catch_up(session)
        except OSError as exc:
            logger.warning("cannot move the document index in %s into %s (%s); it is read from there", folder, self.where, exc)
            lines = self._lines
            self._read(_legacy_records(folder), str(folder))
            self._lines = lines  # line numbers in warnings stay the log's
            return
        logger.info("moved the document index in %s into %s", folder, self.where)
        shutil.rmtree(folder, ignore_errors=True)


def _is_real_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()  # a link in the store folder is never followed


def _legacy_records(folder: Path) -> bytes:
    """The records of an old-layout index folder as log lines: its meta first, then its chunk lines."""
    data = b""
    try:
        meta = json.loads(read_file_in(folder.parent, f"{folder.name}/meta.json"))
        data = json.dumps({"meta": meta}).encode() + b"\n"
    except (OSError, ValueError) as exc:
        logger.warning("cannot read %s (%s); the chunks are moved without it", folder / "meta.json", exc)
    try:
        chunks = read_file_in(folder.parent, f"{folder.name}/chunks.jsonl")
    except FileNotFoundError:
        return data
    except OSError as exc:
        logger.warning("cannot read %s (%s); its chunks are not moved", folder / "chunks.jsonl", exc)
        return data
    lines, _ = whole_lines(chunks)  # a torn last line is dropped
    return data + b"".join(line + b"\n" for line in lines)
