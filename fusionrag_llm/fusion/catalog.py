"""The registered chunks: texts, token ids, embeddings (FAISS) and where to find them in prompts."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from fusionrag_llm.engine.chunk_finder import ChunkFinder
from fusionrag_llm.ingest.neighbours import NeighbourIndex

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
    def __init__(self) -> None:
        self._by_text: dict[str, RegisteredChunk] = {}
        self._rows: list[RegisteredChunk] = []
        self.neighbours = NeighbourIndex()
        self.finder = ChunkFinder()

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, text: str) -> RegisteredChunk | None:
        return self._by_text.get(text)

    def add(self, texts: list[str], token_ids: list[TokenIds], vectors: np.ndarray) -> list[RegisteredChunk]:
        """Register new texts (callers pass only unknown ones) with their normalised embeddings."""
        added = []
        for text, ids in zip(texts, token_ids):
            chunk = RegisteredChunk(chunk_id_of(text), text, ids, row=len(self._rows))
            self._rows.append(chunk)
            self._by_text[text] = chunk
            added.append(chunk)
        self.neighbours.add(vectors)
        self.finder.register(texts)
        return added

    def neighbours_of(self, chunks: list[RegisteredChunk], count: int) -> list[list[RegisteredChunk]]:
        rows = self.neighbours.neighbours([c.row for c in chunks], count)
        return [[self._rows[r] for r in found] for found in rows]
