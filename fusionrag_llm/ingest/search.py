"""Searching the store's document index (what ``fusionrag ingest`` builds): the one retrieval that
``fusionrag query``, the framework retrievers and anyone else use.

The hits' texts are the registered chunk texts, so a prompt built from them reuses their stored KV.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.fusion.embeddings import (
    DEFAULT_EMBEDDING_NAME,
    default_embedder,
    normalized,
)
from fusionrag_llm.ingest.doc_index import LEGACY_FOLDER, DocumentIndex, IndexMeta, documents_file
from fusionrag_llm.request import check_tenant

if TYPE_CHECKING:
    from fusionrag_llm.api import FusionRAG


@dataclass(frozen=True)
class DocumentHit:
    """One retrieved chunk: its text (as registered), the file it came from, its cosine similarity to
    the query and its chunk id (the key of its KV entries, ``rag.chunks[chunk_id]``)."""

    text: str
    source: str
    score: float
    chunk_id: str


def document_index(rag: FusionRAG, tenant: str | None = None) -> DocumentIndex:
    """``tenant``'s retrieval index kept in ``rag``'s store (a file in its folder, or in memory with the
    store); None: the default tenant's."""
    tenant = check_tenant(tenant)
    folder = rag.store.directory
    index = DocumentIndex(
        rag.store.record_log(documents_file(tenant)),
        legacy=None if folder is None or tenant else Path(folder) / LEGACY_FOLDER,
    )
    dim = index.meta.dim if index.meta else 0
    index.check_meta(
        IndexMeta(
            rag.model_name,
            rag.fingerprint,
            DEFAULT_EMBEDDING_NAME,
            dim or _embedding_dim(),
        )
    )
    return index


def _embedding_dim() -> int:
    return default_embedder().dim


class _Searcher:
    """An engine's open index: read once, then only what was appended since (``refresh``)."""

    def __init__(self, rag: FusionRAG, tenant: str):
        self.index = document_index(rag, tenant)
        # the index's lists and FAISS index grow on refresh
        self.lock = threading.Lock()

    def search(self, vector, top_k: int) -> list[tuple[str, str, float]]:
        with self.lock:
            self.index.refresh()
            return self.index.search(vector, top_k)


# FusionRAG -> {tenant: _Searcher}
_searchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_searchers_lock = threading.Lock()


def search_documents(rag: FusionRAG, query: str, top_k: int = 5, tenant: str | None = None) -> list[DocumentHit]:
    """The ``top_k`` chunks of ``rag``'s document index most similar to ``query``, best first.

    Embeds the query with the packaged embedding model (the index's own); chunks ingested since the
    last search are seen. An empty index raises ``FusionRAGError`` saying to run ``fusionrag ingest``.
    ``tenant``: search what was ingested for this tenant (None: the default tenant's index).
    """
    if not isinstance(query, str) or not query.strip():
        raise FusionRAGError(f"the query must be a non-empty string, got {query!r:.60}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise FusionRAGError(f"top_k must be an int >= 1, got {top_k!r}")
    tenant = check_tenant(tenant)
    with _searchers_lock:
        searchers = _searchers.setdefault(rag, {})
        searcher = searchers.get(tenant)
        if searcher is None:
            searcher = searchers[tenant] = _Searcher(rag, tenant)
    vector = normalized(default_embedder()([query]), 1)[0]
    hits = searcher.search(vector, top_k)
    return [
        DocumentHit(text, source, score, chunk_id_of(text))
        for text, source, score in hits
    ]
