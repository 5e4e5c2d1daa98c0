"""A retrieval index of ingested document chunks on disk: FAISS + the chunks' text and vectors.

Files in ``<store>/documents/``: ``chunks.jsonl`` (one line per chunk: text, source, vector;
appended under a lock, the source of truth), ``index.faiss`` (rebuilt from the lines whenever it is
behind them), ``meta.json`` (the model and embedding space it was built for).

A bad line in ``chunks.jsonl`` (not UTF-8, not JSON, a field missing) is skipped with a warning
naming it, and a torn last line never swallows the next append (see ``ingest.jsonl``). A folder
that cannot be written is still searched: the rebuilt FAISS index then stays in memory.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from typing import Any

import numpy as np

from fusionrag_llm.errors import FusionRAGError, require
from fusionrag_llm.ingest.jsonl import parse_line, separator, whole_lines, why_unreadable

logger = logging.getLogger(__name__)


def _faiss() -> Any:
    """FAISS, imported on first use (an optional dependency)."""
    return require("faiss", "embed", "the document index")


@dataclass(frozen=True)
class IndexMeta:
    model: str  # the LLM whose KV entries were stored alongside
    model_fingerprint: str
    embedding: str  # the embedding model (or "given")
    dim: int


class DocumentIndex:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.texts: list[str] = []
        self.sources: list[str] = []
        self._vectors: list[np.ndarray] = []
        self._rows: dict[str, int] = {}
        self.meta: IndexMeta | None = None
        self.index: Any = None  # a faiss.IndexFlatIP once built or read
        self._load()

    def __len__(self) -> int:
        return len(self.texts)

    def __contains__(self, text: str) -> bool:
        return text in self._rows

    def check_meta(self, meta: IndexMeta) -> None:
        """Refuse to mix models or embedding spaces in one index."""
        if self.meta is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            _write_atomic(self.folder / "meta.json", json.dumps(meta.__dict__, indent=2).encode())
            self.meta = meta
        elif self.meta.model_fingerprint != meta.model_fingerprint:
            raise FusionRAGError(
                f"the index in {str(self.folder)!r} was built with model {self.meta.model!r}, not {meta.model!r}; "
                f"pass --model {self.meta.model} or use another --store"
            )
        elif (self.meta.embedding, self.meta.dim) != (meta.embedding, meta.dim):
            raise FusionRAGError(f"the index in {str(self.folder)!r} uses embeddings {self.meta.embedding!r} ({self.meta.dim}-d)")

    def add(self, texts: list[str], sources: list[str], vectors: np.ndarray) -> None:
        lines = "".join(json.dumps({"text": t, "source": s, "vector": v.tolist()}) + "\n" for t, s, v in zip(texts, sources, vectors))
        with open(self.folder / "chunks.jsonl", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released on close
            handle.write(separator(handle) + lines.encode())
            handle.flush()
        for text, source, vector in zip(texts, sources, vectors):
            self._remember(text, source, vector)
        self._write_index()

    def vector_of(self, text: str) -> np.ndarray:
        return self._vectors[self._rows[text]]

    def _remember(self, text: str, source: str, vector: np.ndarray) -> None:
        if text not in self._rows:
            self._rows[text] = len(self.texts)
            self.texts.append(text)
            self.sources.append(source)
            self._vectors.append(np.asarray(vector, dtype=np.float32))

    def search(self, vector: np.ndarray, k: int) -> list[tuple[str, str, float]]:
        """(text, source, score) of the k most similar chunks, best first."""
        if not self.texts:
            raise FusionRAGError(f"the index in {str(self.folder)!r} is empty; run 'fusionrag ingest PATH' first")
        scores, rows = self.index.search(np.asarray(vector, dtype=np.float32)[None], min(k, len(self.texts)))
        return [(self.texts[r], self.sources[r], float(s)) for r, s in zip(rows[0], scores[0]) if r >= 0]

    def _load(self) -> None:
        meta_path, lines_path = self.folder / "meta.json", self.folder / "chunks.jsonl"
        if meta_path.is_file():
            self.meta = IndexMeta(**json.loads(meta_path.read_text()))
        if lines_path.is_file():
            self._read_lines(lines_path)
        index_path = self.folder / "index.faiss"
        if index_path.is_file():
            self.index = _faiss().read_index(str(index_path))
        if self.index is None or self.index.ntotal != len(self.texts):
            try:
                self._write_index()
            except (OSError, RuntimeError) as exc:  # a read-only store is still searched (faiss raises RuntimeError)
                logger.warning("cannot save the rebuilt index in %s (%s); it is kept in memory", self.folder, exc)

    def _read_lines(self, path: Path) -> None:
        lines, _ = whole_lines(path.read_bytes())  # a torn last line is left to its writer
        for number, raw in enumerate(lines, 1):
            try:
                record = parse_line(raw)
                text, source, vector = record["text"], record["source"], np.asarray(record["vector"], dtype=np.float32)
                if not isinstance(text, str) or not isinstance(source, str) or vector.ndim != 1 or not vector.size:
                    raise ValueError("text and source must be strings, vector a list of numbers")
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("skipping line %d of %s: %s", number, path, why_unreadable(exc))
                continue
            self._remember(text, source, vector)

    def _write_index(self) -> None:
        if not self._vectors:
            return
        index = _faiss().IndexFlatIP(len(self._vectors[0]))
        index.add(np.stack(self._vectors))
        self.index = index
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.folder / f".index.faiss.{os.getpid()}"
        _faiss().write_index(index, str(partial))
        os.replace(partial, self.folder / "index.faiss")


def _write_atomic(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_bytes(data)
    os.replace(partial, path)
