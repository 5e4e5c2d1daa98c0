"""Plain and fused chunk entries of one model in one store: the four parts behind one name.

``ChunkEntries`` is a thin composition for callers that want everything at hand (the facade, the
engine, benchmarks): the key scheme (``keys``: ``EntryKeys``), checked store access
(``entry_store``: ``EntryStore``), the model forwards that make entries (``computer``:
``EntryComputer``) and placement into a request's cache (``place_entry``). Code that needs only
one job takes that part: the resolve plan needs keys alone, placement needs no store.
"""

from __future__ import annotations

from typing import Sequence

from fusionrag_llm.fusion.entry_compute import PREFIX_MEMO_SIZE, EntryComputer
from fusionrag_llm.fusion.entry_keys import EntryKeys, TokenIds, storage_fingerprint
from fusionrag_llm.fusion.entry_store import EntryStore, Found
from fusionrag_llm.fusion.placement import place_entry
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.storage import KVEntry, TieredStore

__all__ = ["PREFIX_MEMO_SIZE", "ChunkEntries", "EntryComputer", "EntryKeys", "EntryStore", "TokenIds",
           "place_entry", "storage_fingerprint"]  # fmt: skip


class ChunkEntries:
    """Chunk entries of one model in one store, keyed by content (model, S0, tokens, variant)."""

    def __init__(self, model: DecoderLM, store: TieredStore, fingerprint: str, s0_ids: TokenIds):
        self.model = model
        self.store = store
        kv_shape = (model.cfg.num_layers, model.cfg.num_kv_heads, model.cfg.head_dim)
        self.keys = EntryKeys.for_store(fingerprint, s0_ids, model.dtype, store.storage_dtype, store.codec_id, kv_shape)
        self.entry_store = EntryStore(self.store, self.keys)
        self.computer = EntryComputer(self.model, self.keys, self.entry_store)

    @property
    def lossless(self) -> bool:
        return self.keys.lossless

    @property
    def fingerprint(self) -> str:
        return self.keys.fingerprint

    @property
    def s0_ids(self) -> TokenIds:
        return self.keys.s0_ids

    # ------------------------------------------------------------------ keys
    def key(self, token_ids: Sequence[int], variant: str) -> str:
        return self.keys.key(token_ids, variant)

    # ------------------------------------------------------------------ store access
    def lookup(self, token_ids: TokenIds, variant: str) -> Found | None:
        return self.entry_store.lookup(token_ids, variant)

    def contains(self, token_ids: TokenIds, variant: str) -> bool:
        return self.entry_store.contains(token_ids, variant)

    # ------------------------------------------------------------------ computing
    def compute_plain(self, chunks: Sequence[TokenIds], max_batch_tokens: int = 2048) -> list[KVEntry]:
        return self.computer.compute_plain(chunks, max_batch_tokens)
