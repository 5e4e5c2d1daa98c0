"""Reading and writing one model's entries in a store, each read checked against what its key asked for.

The store checks bytes and token ids; this layer adds the entry's claim (variant and model) on
top, so a read either returns exactly the entry the key names or is a miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from fusionrag_llm.fusion.entry_keys import EntryKeys, TokenIds
from fusionrag_llm.storage import KVEntry, TieredStore

Found = tuple[KVEntry, str]  # the entry and the tier it came from


@dataclass
class EntryStore:
    store: TieredStore
    keys: EntryKeys

    @classmethod
    def of(cls, store: TieredStore, fingerprint: str, s0_ids: Sequence[int], model_dtype: torch.dtype,
           kv_shape: tuple[int, int, int]) -> EntryStore:  # fmt: skip
        """The entries a model (``fingerprint``, computing in ``model_dtype``, KV of ``kv_shape`` =
        (layers, kv heads, head dim)) keeps in ``store`` after S0, keyed as the store's dtype and codec
        ask and checked against that form on every read (``EntryKeys.for_store``)."""
        keys = EntryKeys.for_store(fingerprint, s0_ids, model_dtype, store.storage_dtype, store.codec_id, kv_shape)
        return cls(store, keys)

    def fetch(self, key: str, token_ids: Sequence[int], variant: str, pin: bool = False) -> Found | None:
        """``(entry, tier)`` stored under ``key`` when its token ids, variant and model all match: the
        tier's own tensors (read only). ``pin``: pinned on a match (the caller unpins ``key``)."""
        found = self.store.get(key, expect_token_ids=token_ids, copy=False, pin=pin)
        if found is not None and not self.keys.accepts(found[0], key, variant):
            if pin:
                self.store.unpin(key)
            return None
        return found

    def lookup(self, token_ids: TokenIds, variant: str) -> Found | None:
        """The chunk's ``variant`` entry, checked as ``fetch`` does."""
        return self.fetch(self.keys.key(token_ids, variant), token_ids, variant)

    def contains(self, token_ids: TokenIds, variant: str) -> bool:
        return self.keys.key(token_ids, variant) in self.store

    def put(self, entry: KVEntry, variant: str, persist: bool = False) -> bool:
        """Store ``entry`` as the chunk's ``variant``; ``persist``: a failed disk write raises."""
        return self.store.put(self.keys.key(entry.token_ids, variant), entry, persist=persist)

    def as_stored(self, entry: KVEntry) -> KVEntry:
        """``entry`` as the store keeps it (itself in a lossless store; cast or packed in a lossy
        one), so KV used right after computing it equals what later reads of its key give."""
        return entry if self.keys.lossless else self.store.stored_form(entry)

    def put_keyed(self, key: str, entry: KVEntry, persist: bool = False) -> bool:
        """Store ``entry`` under a key already computed (a plan's chunk key)."""
        return self.store.put(key, entry, persist=persist)

    def put_block(self, key: str, entry: KVEntry) -> bool:
        """Store an exact path block under a plan's block key, in its own dtype (never cast)."""
        return self.store.put(key, entry, exact=True)
