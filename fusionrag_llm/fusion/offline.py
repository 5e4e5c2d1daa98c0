"""The offline stage: plain entries, embeddings and FAISS neighbours, fused entries (DESIGN.md section 3).

Idempotent: entries are keyed by content, so a second call with the same texts computes nothing.
Plain entries of all chunks exist before any chunk is fused (two passes).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from tqdm.auto import tqdm

from fusionrag_llm.errors import FusionRAGError, PromptTooLongError
from fusionrag_llm.fusion.catalog import ChunkCatalog, RegisteredChunk
from fusionrag_llm.fusion.chunk_entries import ChunkEntries
from fusionrag_llm.ingest.embeddings import Embedder, default_embedder, normalized

logger = logging.getLogger(__name__)


@dataclass
class IngestReport:
    chunk_ids: list[str]
    plain_computed: int = 0
    fused_computed: int = 0


def validate_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise FusionRAGError("texts must be a list of strings, not a single string")
    texts = list(texts)
    for index, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise FusionRAGError(f"texts[{index}] must be a non-empty string, got {text!r:.60}")
    return texts


def add_chunks(
    entries: ChunkEntries,
    catalog: ChunkCatalog,
    encode,
    texts: Sequence[str],
    fuse: bool = True,
    neighbors: int = 10,
    embeddings=None,
    embedder: Embedder | None = None,
    progress: bool = True,
) -> IngestReport:
    """Register ``texts`` as chunks and store their plain (and, with ``fuse``, fused) entries."""
    texts = validate_texts(texts)
    if isinstance(neighbors, bool) or not isinstance(neighbors, int) or neighbors < 0:
        raise FusionRAGError(f"neighbors must be an int >= 0, got {neighbors!r}")
    vectors = normalized(embeddings, len(texts)) if embeddings is not None else None
    unique = list(dict.fromkeys(texts))
    new_texts = [text for text in unique if catalog.get(text) is None]
    if new_texts:
        token_ids = [tuple(encode(text)) for text in new_texts]
        _check_window(entries, token_ids)
        if vectors is None:
            new_vectors = normalized((embedder or default_embedder())(new_texts), len(new_texts))
        else:
            first_row = {text: row for row, text in reversed(list(enumerate(texts)))}
            new_vectors = vectors[[first_row[text] for text in new_texts]]
        catalog.add(new_texts, token_ids, new_vectors)
    chunks = [catalog.get(text) for text in unique]
    report = IngestReport(chunk_ids=[catalog.get(text).chunk_id for text in texts])
    report.plain_computed = _ensure_plain(entries, chunks, progress)
    if fuse:
        report.fused_computed = _ensure_fused(entries, catalog, chunks, neighbors, progress)
    return report


def _check_window(entries: ChunkEntries, token_ids: list[tuple[int, ...]]) -> None:
    window = entries.model.cfg.max_position_embeddings
    for ids in token_ids:
        if len(entries.s0_ids) + len(ids) > window:
            raise PromptTooLongError(
                f"a chunk of {len(ids)} tokens does not fit the context window of {window} tokens "
                f"after the {len(entries.s0_ids)}-token prefix; split it into smaller chunks"
            )


def _ensure_plain(entries: ChunkEntries, chunks: list[RegisteredChunk], progress: bool) -> int:
    missing = [c for c in chunks if not entries.contains(c.token_ids, "plain")]
    if not missing:
        return 0
    with tqdm(total=len(missing), desc="plain entries", unit="chunk", disable=not progress) as bar:
        for start in range(0, len(missing), 16):
            batch = missing[start : start + 16]
            for entry in entries.compute_plain([c.token_ids for c in batch]):
                entries.put(entry, "plain")
            bar.update(len(batch))
    return len(missing)


def _ensure_fused(entries: ChunkEntries, catalog: ChunkCatalog, chunks: list[RegisteredChunk],
                  neighbors: int, progress: bool) -> int:  # fmt: skip
    neighbour_lists = catalog.neighbours_of(chunks, neighbors)
    computed = 0
    for chunk, found in tqdm(list(zip(chunks, neighbour_lists)), desc="fused entries", unit="chunk", disable=not progress):
        wanted = [n.chunk_id for n in found]
        existing = entries.lookup(chunk.token_ids, "fused")
        if existing is not None and existing[0].meta.get("requested") == wanted:
            continue
        plain = [_plain_entry(entries, n) for n in found]
        entries.put(entries.compute_fused(chunk.token_ids, plain, wanted), "fused")
        computed += 1
    return computed


def _plain_entry(entries: ChunkEntries, chunk: RegisteredChunk):
    found = entries.lookup(chunk.token_ids, "plain")
    if found is not None:
        return found[0]
    entry = entries.compute_plain([chunk.token_ids])[0]  # evicted from a bounded store: recompute
    entries.put(entry, "plain")
    return entry
