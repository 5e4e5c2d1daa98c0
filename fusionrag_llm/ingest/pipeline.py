"""Files -> chunks -> embeddings -> the store's retrieval index (``doc_index``) -> plain and fused KV entries.

Resumable: chunks are committed in batches (KV entries first, then their index lines), so an
interrupted run loses at most the batch in flight, and a re-run skips what is there. With
``workers`` (Ray worker processes) all new chunks go to the workers in one call and their index
lines follow it; an interrupted run re-sends them and the workers skip the entries already stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
from tqdm.auto import tqdm

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.ingest.doc_index import DocumentIndex
from fusionrag_llm.ingest.documents import load_chunks
from fusionrag_llm.ingest.search import DocumentHit, document_index, search_documents
from fusionrag_llm.fusion.embeddings import default_embedder, normalized
from fusionrag_llm.request import RAGRequest

if TYPE_CHECKING:  # the facade is passed in: ingest sits below it (fusion uses ingest's helpers)
    from fusionrag_llm.api import FusionRAG
    from fusionrag_llm.engine.llm_engine import Generation

BATCH = 32


@dataclass
class IngestSummary:
    files: int
    chunks: int
    new_chunks: int
    plain_computed: int
    fused_computed: int


def ingest_paths(rag: FusionRAG, paths: Sequence[str | Path], max_words: int = 200, neighbors: int = 10,
                 fuse: bool = True, progress: bool = True, variant_notes: bool = False,
                 workers: int | None = None, tenant: str | None = None) -> IngestSummary:  # fmt: skip
    """Ingest text/markdown files and folders; every file is read and checked before anything is stored.

    Chunks are registered in reading order (files in the order given, folders sorted).
    ``workers``: compute the entries in that many Ray worker processes (``FusionRAG.ingest``).
    ``tenant``: into that tenant's retrieval index and chunks (None: the default tenant's)."""
    chunks = load_chunks(paths, max_words)
    index = document_index(rag, tenant)
    new = [c for c in dict.fromkeys(chunks) if c.text not in index]
    new = list({c.text: c for c in new}.values())  # the same text in two files is one chunk
    if workers is not None:
        return _ingest_with_workers(rag, chunks, new, index, neighbors, fuse, progress, variant_notes,
                                    workers, tenant)  # fmt: skip
    embed = default_embedder()
    plain = 0
    for start in tqdm(range(0, len(new), BATCH), desc="chunks", unit="batch", disable=not progress):
        batch = new[start : start + BATCH]
        vectors = normalized(embed([c.text for c in batch]), len(batch))
        plain += rag.add_chunks([c.text for c in batch], fuse=False, embeddings=vectors, tenant=tenant).plain_computed
        index.add([c.text for c in batch], [c.source for c in batch], vectors)
    fused = 0
    if fuse:
        texts = list(dict.fromkeys(c.text for c in chunks))
        vectors = np.stack([index.vector_of(t) for t in texts])
        fused = rag.add_chunks(texts, fuse=True, neighbors=neighbors, embeddings=vectors, progress=progress,
                               variant_notes=variant_notes, tenant=tenant).fused_computed  # fmt: skip
    files = len({c.source for c in chunks})
    return IngestSummary(files, len(chunks), len(new), plain, fused)


def _ingest_with_workers(rag: FusionRAG, chunks: list, new: list, index: DocumentIndex, neighbors: int, fuse: bool,
                         progress: bool, notes: bool, workers: int, tenant: str | None) -> IngestSummary:  # fmt: skip
    """All chunks in one call to the workers (their models load once), then the new ones' index lines."""
    texts = list(dict.fromkeys(c.text for c in chunks))
    new_vectors = normalized(default_embedder()([c.text for c in new]), len(new)) if new else None
    embedded = dict(zip((c.text for c in new), new_vectors)) if new else {}
    vectors = np.stack([embedded[t] if t in embedded else index.vector_of(t) for t in texts])
    report = rag.add_chunks(texts, fuse=fuse, neighbors=neighbors, embeddings=vectors, progress=progress,
                        variant_notes=notes, workers=workers, tenant=tenant)  # fmt: skip
    if new:
        index.add([c.text for c in new], [c.source for c in new], new_vectors)
    return IngestSummary(len({c.source for c in chunks}), len(chunks), len(new), report.plain_computed,
                         report.fused_computed)  # fmt: skip


def answer(rag: FusionRAG, question: str, top_k: int = 5, tenant: str | None = None,
           **generate_options) -> tuple[Generation, list[DocumentHit]]:  # fmt: skip
    """Retrieve the ``top_k`` chunks most similar to ``question`` (``search_documents``) and answer over them,
    as ``tenant`` (its retrieval index and chunks; None: the default tenant)."""
    if not question.strip():
        raise FusionRAGError("the question is empty")
    hits = search_documents(rag, question, top_k, tenant)
    request = RAGRequest(chunks=[hit.text for hit in hits], question=question, tenant=tenant)
    out = rag.generate(request, **generate_options)
    return out, hits
