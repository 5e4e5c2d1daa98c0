"""What the facade shows of its store: the registered chunks (``rag.chunks``) and the stored entries
of one chunk (``rag.stored``), as read-only records for users and tools.

The engine works on the catalog and the entry store themselves; these records copy what they show,
so nothing a caller does with them reaches the store.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.catalog import ChunkCatalog
from fusionrag_llm.fusion.entry_keys import EntryKeys, TokenIds
from fusionrag_llm.fusion.entry_store import EntryStore
from fusionrag_llm.storage import KVEntry
from fusionrag_llm.storage.entry import normalise_token_ids

VARIANTS = ("plain", "fused")


@dataclass(frozen=True)
class ChunkInfo:
    """A registered chunk: its id (``add_chunks`` returns them), text and token ids, and the chunks its
    fused entry of this model was computed after, most similar first (``()`` while it has none)."""

    chunk_id: str
    text: str
    token_ids: TokenIds
    neighbor_ids: tuple[str, ...]


@dataclass(frozen=True)
class StoredEntry:
    """A stored chunk entry, checked as a request reads it: its store ``key``, the ``tier`` it was found
    in (``"device"``, ``"host"``, ``"disk"`` or ``"remote"``) and a copy of the ``entry`` (token ids,
    position-free keys and values ``[layers, kv_heads, tokens, head_dim]``, meta)."""

    key: str
    tier: str
    entry: KVEntry


class RegisteredChunks(Mapping[str, ChunkInfo]):
    """The chunks registered in the store, by chunk id, in registration order (read-only).

    Each access first reads what other processes (or engines on the same store) registered since.
    """

    def __init__(self, catalog: ChunkCatalog, keys: EntryKeys, lock: threading.RLock):
        self._catalog = catalog
        self._keys = keys
        self._lock = lock  # the engine's: the catalog is not read while an ingestion appends to it

    def __getitem__(self, chunk_id: str) -> ChunkInfo:
        with self._lock:
            self._catalog.refresh()
            chunk = self._catalog.by_id(chunk_id)
            if chunk is None:
                raise KeyError(chunk_id)
            record = self._catalog.fused_record(self._keys.key(chunk.token_ids, "fused"))
        return ChunkInfo(chunk.chunk_id, chunk.text, chunk.token_ids, record.neighbours if record is not None else ())

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            self._catalog.refresh()
            return iter(self._catalog.chunk_ids())

    def __len__(self) -> int:
        with self._lock:
            self._catalog.refresh()
            return len(self._catalog)

    def __repr__(self) -> str:
        return f"<RegisteredChunks: {len(self)} chunks>"


def read_stored(entry_store: EntryStore, chunks: RegisteredChunks, chunk: str | Sequence[int],
                variant: str) -> StoredEntry | None:  # fmt: skip
    """The ``variant`` entry of ``chunk`` (a chunk id of ``chunks``, or token ids) as a request would
    read it (token ids, variant and model checked), copied; None on a miss."""
    if variant not in VARIANTS:
        raise FusionRAGError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    token_ids = _token_ids_of(chunks, chunk)
    found = entry_store.lookup(token_ids, variant)
    if found is None:
        return None
    entry, tier = found
    return StoredEntry(entry_store.keys.key(token_ids, variant), tier, entry.copy_to())


def _token_ids_of(chunks: RegisteredChunks, chunk: str | Sequence[int]) -> TokenIds:
    if isinstance(chunk, str):
        info = chunks.get(chunk)
        if info is None:
            raise FusionRAGError(f"no chunk with id {chunk!r} is registered; pass an id add_chunks returned "
                                 "(rag.chunks lists them) or the chunk's token ids")  # fmt: skip
        return info.token_ids
    try:
        token_ids = normalise_token_ids(chunk)
    except ValueError as exc:
        raise FusionRAGError(f"a chunk is given by its chunk id or its token ids: {exc}") from None
    if not token_ids:
        raise FusionRAGError("a chunk is given by its chunk id or its token ids, got no token ids")
    return token_ids
