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
CATALOG_FILE = "catalog.jsonl"


def chunk_id_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class RegisteredChunk:
    chunk_id: str
    text: str
    token_ids: TokenIds
    space: int  # embedding dimension: chunks are only compared with chunks embedded the same way
    row: int  # row in that space's neighbour index


class ChunkCatalog:
    def __init__(self, folder: Path | None = None, encode: Callable[[str], list[int]] | None = None) -> None:
        self._by_text: dict[str, RegisteredChunk] = {}
        self._rows: dict[int, list[RegisteredChunk]] = {}  # per embedding space
        self._spaces: dict[int, NeighbourIndex] = {}
        self.finder = ChunkFinder()
        self.path = None if folder is None else Path(folder) / CATALOG_FILE
        if self.path is not None and self.path.is_file() and encode is not None:
            self._load(encode)

    def __len__(self) -> int:
        return len(self._by_text)

    def get(self, text: str) -> RegisteredChunk | None:
        return self._by_text.get(text)

    def add(self, texts: list[str], token_ids: list[TokenIds], vectors: np.ndarray, persist: bool = True) -> list[RegisteredChunk]:
        """Register new texts (callers pass only unknown ones) with their normalised embeddings."""
        space = int(vectors.shape[1])
        rows = self._rows.setdefault(space, [])
        added = []
        for text, ids in zip(texts, token_ids):
            chunk = RegisteredChunk(chunk_id_of(text), text, ids, space=space, row=len(rows))
            rows.append(chunk)
            self._by_text[text] = chunk
            added.append(chunk)
        self._spaces.setdefault(space, NeighbourIndex()).add(vectors)
        self.finder.register(texts)
        if persist and self.path is not None:
            self._append(texts, vectors)
        return added

    def neighbours_of(self, chunks: list[RegisteredChunk], count: int) -> list[list[RegisteredChunk]]:
        """Up to ``count`` most similar other chunks of each chunk's embedding space, most similar first."""
        result = []
        for chunk in chunks:
            (found,) = self._spaces[chunk.space].neighbours([chunk.row], count)
            result.append([self._rows[chunk.space][row] for row in found])
        return result

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
        seen: set[str] = set()
        by_space: dict[int, list[tuple[str, np.ndarray]]] = {}
        with open(self.path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    record = json.loads(line)
                    text, vector = record["text"], np.asarray(record["vector"], dtype=np.float32)
                    if not isinstance(text, str) or vector.ndim != 1:
                        raise ValueError("bad record")
                except (ValueError, KeyError, TypeError):
                    logger.warning("skipping unreadable line %d of %s", number, self.path)
                    continue
                if text not in self._by_text and text not in seen:
                    seen.add(text)
                    by_space.setdefault(vector.shape[0], []).append((text, vector))
        for records in by_space.values():
            texts = [text for text, _ in records]
            self.add(texts, [tuple(encode(t)) for t in texts], np.stack([v for _, v in records]), persist=False)
