"""The registered chunks: texts, token ids, embeddings (FAISS) and where to find them in prompts.

With a folder, the texts and their embeddings are appended to ``catalog.jsonl`` there, so another
process opening the same store knows them too (for neighbour search and for finding chunks in flat
prompts). Lines are appended under an exclusive file lock; a torn last line is ignored on load.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from fusionrag_llm.engine.chunk_finder import ChunkFinder
from fusionrag_llm.ingest.neighbours import NeighbourIndex

logger = logging.getLogger(__name__)
TokenIds = tuple[int, ...]


def chunk_id_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class RegisteredChunk:
    chunk_id: str
    text: str
    token_ids: TokenIds
    row: int  # row in the neighbour index


class ChunkCatalog:
    def __init__(self, folder: Path | None = None, encode: Callable[[str], list[int]] | None = None) -> None:
        self._by_text: dict[str, RegisteredChunk] = {}
        self._rows: list[RegisteredChunk] = []
        self.neighbours = NeighbourIndex()
        self.finder = ChunkFinder()
        self.path = None if folder is None else Path(folder) / "catalog.jsonl"
        if self.path is not None and self.path.is_file() and encode is not None:
            self._load(encode)

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, text: str) -> RegisteredChunk | None:
        return self._by_text.get(text)

    def add(self, texts: list[str], token_ids: list[TokenIds], vectors: np.ndarray, persist: bool = True) -> list[RegisteredChunk]:
        """Register new texts (callers pass only unknown ones) with their normalised embeddings."""
        if len(self) and vectors.shape[1] != self.neighbours.dim:
            raise ValueError(f"embeddings of dimension {vectors.shape[1]} differ from the registered chunks' {self.neighbours.dim}")
        added = []
        for text, ids in zip(texts, token_ids):
            chunk = RegisteredChunk(chunk_id_of(text), text, ids, row=len(self._rows))
            self._rows.append(chunk)
            self._by_text[text] = chunk
            added.append(chunk)
        self.neighbours.add(vectors)
        self.finder.register(texts)
        if persist and self.path is not None:
            self._append(texts, vectors)
        return added

    def neighbours_of(self, chunks: list[RegisteredChunk], count: int) -> list[list[RegisteredChunk]]:
        rows = self.neighbours.neighbours([c.row for c in chunks], count)
        return [[self._rows[r] for r in found] for found in rows]

    def _append(self, texts: list[str], vectors: np.ndarray) -> None:
        lines = "".join(json.dumps({"text": t, "vector": v.tolist()}) + "\n" for t, v in zip(texts, vectors))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                handle.write(lines)
                handle.flush()
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _load(self, encode: Callable[[str], list[int]]) -> None:
        texts, vectors = [], []
        with open(self.path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    record = json.loads(line)
                    text, vector = record["text"], np.asarray(record["vector"], dtype=np.float32)
                except (ValueError, KeyError, TypeError):
                    logger.warning("skipping unreadable line %d of %s", number, self.path)
                    continue
                if text in self._by_text or text in texts or (vectors and vector.shape != vectors[0].shape):
                    continue
                texts.append(text)
                vectors.append(vector)
        if texts:
            self.add(texts, [tuple(encode(t)) for t in texts], np.stack(vectors), persist=False)
