"""Nearest chunks by embedding, with FAISS (inner product on normalised vectors)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fusionrag_llm.errors import FusionRAGError, require


def _flat_ip_index(dim: int) -> Any:
    # Imported on first use: importing the package (or answering with a fixed chunk list) needs no FAISS.
    return require("faiss", "embed", "the neighbour search of fused chunks").IndexFlatIP(dim)


class NeighbourIndex:
    """All registered chunks' embeddings in a flat inner-product FAISS index, in insertion order."""

    def __init__(self, dim: int | None = None):
        self.dim = dim
        self.index = _flat_ip_index(dim) if dim else None

    def __len__(self) -> int:
        return 0 if self.index is None else self.index.ntotal

    def add(self, vectors: np.ndarray) -> None:
        """Append normalised vectors [n, dim]; row i of all additions is chunk number i."""
        if self.index is None:
            self.dim = vectors.shape[1]
            self.index = _flat_ip_index(self.dim)
        if vectors.shape[1] != self.dim:
            raise FusionRAGError(f"embedding dimension {vectors.shape[1]} differs from the index's {self.dim}")
        self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def neighbours(self, rows: list[int], count: int) -> list[list[int]]:
        """For each row, up to ``count`` other rows, most similar first."""
        return [[row for row, _ in hits] for hits in self.search(rows, count)]

    def search(self, rows: list[int], count: int) -> list[list[tuple[int, float]]]:
        """For each row, up to ``count`` ``(other row, inner product)``, most similar first."""
        if self.index is None or count <= 0:
            return [[] for _ in rows]
        vectors = np.stack([self.index.reconstruct(row) for row in rows])
        k = min(count + 1, self.index.ntotal)
        scores, found = self.index.search(vectors, k)
        return [[(int(j), float(s)) for j, s in zip(hits, sims) if j >= 0 and j != row][:count]
                for row, hits, sims in zip(rows, found, scores)]  # fmt: skip

    def vector(self, row: int) -> np.ndarray:
        """The normalised vector of ``row`` [dim]."""
        return self.index.reconstruct(row)

    def vectors(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start`` to ``stop`` (exclusive) [stop - start, dim]."""
        return self.index.reconstruct_n(start, stop - start)
