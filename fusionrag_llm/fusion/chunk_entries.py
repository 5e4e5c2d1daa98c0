"""Plain and fused chunk entries: computing them (offline or on a miss) and finding them in the store.

A plain entry is a chunk's KV computed after the canonical prefix S0; a fused entry is its KV
computed after S0 and its neighbours' plain entries (FusionRAG eq. 10). Keys are stored before
rotary embedding, so an entry can be placed at any position of a later prompt.

What an entry claims to be is checked on every read, not only its bytes: the store binds each entry
to its key, and the entry's meta names its variant and the model fingerprint, so an entry filed
under the wrong variant or written by another model is a miss. A store that keeps entries in a
lossy dtype (``store_dtype="float16"`` under float32 compute) gets keys of its own and never serves
exact path blocks: such KV is approximate, so it is reused only where approximation is allowed (and
can be selected for recompute); the prompt prefix is then kept exact in this process's memory.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from typing import Sequence

import torch

from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM, ForwardPass
from fusionrag_llm.storage import KVEntry, TieredStore, chunk_key, path_key

TokenIds = tuple[int, ...]
logger = logging.getLogger(__name__)
PREFIX_MEMO_SIZE = 8  # exact prompt prefixes kept in memory when the store is lossy


def storage_fingerprint(fingerprint: str, model_dtype: torch.dtype, storage_dtype: torch.dtype | None) -> str:
    """The fingerprint keys are made from: the model's own, or a distinct one for a lossy storage dtype."""
    if storage_dtype is None or storage_dtype == model_dtype:
        return fingerprint
    stored_as = str(storage_dtype).removeprefix("torch.")
    return hashlib.sha256(f"{fingerprint}:stored-as:{stored_as}".encode()).hexdigest()


class ChunkEntries:
    """Chunk entries of one model in one store, keyed by content (model, S0, tokens, variant)."""

    def __init__(self, model: DecoderLM, store: TieredStore, fingerprint: str, s0_ids: TokenIds):
        self.model = model
        self.store = store
        self.lossless = store.storage_dtype in (None, model.dtype)
        self.fingerprint = storage_fingerprint(fingerprint, model.dtype, store.storage_dtype)
        self.s0_ids = tuple(s0_ids)
        self._prefix_memo: OrderedDict[TokenIds, KVEntry] = OrderedDict()

    def key(self, token_ids: Sequence[int], variant: str) -> str:
        return chunk_key(self.fingerprint, self.s0_ids, token_ids, variant)

    def meta(self, variant: str, **extra) -> dict:
        """Meta of an entry this engine writes: what it is and which model computed it."""
        return {"variant": variant, "model": self.fingerprint, **extra}

    def accepts(self, entry: KVEntry, key: str, variant: str) -> bool:
        """Whether a stored entry is what ``key`` asked for: its variant and model, not only its bytes."""
        claimed = (entry.meta.get("variant"), entry.meta.get("model"))
        if claimed == (variant, self.fingerprint):
            return True
        logger.warning("store entry %s claims variant %r of model %.12s, expected %r of %.12s; treated as a miss",
                       key, claimed[0], claimed[1], variant, self.fingerprint)  # fmt: skip
        return False

    def fetch(self, key: str, token_ids: Sequence[int], variant: str) -> tuple[KVEntry, str] | None:
        """``(entry, tier)`` stored under ``key`` when its token ids, variant and model all match."""
        found = self.store.get(key, expect_token_ids=token_ids, copy=False)
        return found if found is not None and self.accepts(found[0], key, variant) else None

    def lookup(self, token_ids: TokenIds, variant: str) -> tuple[KVEntry, str] | None:
        return self.fetch(self.key(token_ids, variant), token_ids, variant)

    def contains(self, token_ids: TokenIds, variant: str) -> bool:
        return self.key(token_ids, variant) in self.store

    def put(self, entry: KVEntry, variant: str, persist: bool = False) -> bool:
        """Store ``entry`` as the chunk's ``variant``; ``persist``: a failed disk write raises."""
        return self.store.put(self.key(entry.token_ids, variant), entry, persist=persist)

    # ------------------------------------------------------------------ exact paths
    def path_key(self, *segments: Sequence[int]) -> str:
        return path_key(self.fingerprint, *segments)

    def prefix_entry(self, token_ids: TokenIds) -> tuple[KVEntry, bool]:
        """Exact KV of a prompt prefix run from position 0 and whether it was already known.

        A lossless store keeps it as a path entry; a lossy one cannot hold exact KV, so it is kept
        in this process's memory instead.
        """
        if not self.lossless:
            return self._memo_prefix(tuple(token_ids))
        key = self.path_key(token_ids)
        found = self.fetch(key, token_ids, "path")
        if found is not None:
            return found[0], True
        entry = self.compute_exact(token_ids)
        self.store.put(key, entry)
        return entry, False

    def _memo_prefix(self, token_ids: TokenIds) -> tuple[KVEntry, bool]:
        if token_ids in self._prefix_memo:
            self._prefix_memo.move_to_end(token_ids)
            return self._prefix_memo[token_ids], True
        entry = self.compute_exact(token_ids)
        self._prefix_memo[token_ids] = entry
        if len(self._prefix_memo) > PREFIX_MEMO_SIZE:
            self._prefix_memo.popitem(last=False)
        return entry, False

    def compute_exact(self, token_ids: TokenIds) -> KVEntry:
        cache = self.model.new_cache(len(token_ids))
        ids = torch.tensor(token_ids, device=self.model.device)
        positions = torch.arange(len(token_ids), device=self.model.device)
        step = ForwardPass(ids, positions, cache.reserve(len(ids)), logit_rows=ids[:0], capture_raw_kv=True)
        out = self.model(step, cache)
        return KVEntry(tuple(token_ids), out.raw_keys, out.raw_values, self.meta("path"))

    def place(self, cache: KVCache, entry: KVEntry, start_position: int) -> torch.Tensor:
        """Put ``entry`` into the next slots at consecutive positions from ``start_position``."""
        slots = cache.reserve(len(entry.token_ids))
        positions = torch.arange(start_position, start_position + len(slots), device=slots.device)
        keys = entry.keys.to(device=cache.keys.device, dtype=cache.keys.dtype)
        cache.keys[:, :, slots] = self.model.rotate(keys.contiguous(), positions)
        cache.values[:, :, slots] = entry.values.to(device=cache.keys.device, dtype=cache.keys.dtype)
        cache.positions[slots] = positions
        cache.valid[slots] = True
        return slots

    # ------------------------------------------------------------------ computing entries
    def compute_plain(self, chunks: Sequence[TokenIds], max_batch_tokens: int = 2048) -> list[KVEntry]:
        """Plain entries of ``chunks``; several chunks share one forward pass (each sees S0 and itself)."""
        entries: list[KVEntry] = []
        for batch in _batches(chunks, max_batch_tokens):
            entries.extend(self._plain_batch(batch))
        return entries

    def _plain_batch(self, batch: Sequence[TokenIds]) -> list[KVEntry]:
        s0, _ = self.prefix_entry(self.s0_ids)
        start = len(self.s0_ids)
        cache = self.model.new_cache(start + sum(map(len, batch)))
        self.place(cache, s0, 0)
        device = self.model.device
        ids = torch.tensor([t for chunk in batch for t in chunk], device=device)
        positions = torch.cat([torch.arange(start, start + len(c), device=device) for c in batch])
        groups = torch.cat([torch.full((len(c),), i + 1, dtype=torch.int32, device=device) for i, c in enumerate(batch)])
        step = ForwardPass(ids, positions, cache.reserve(len(ids)), logit_rows=ids[:0], capture_raw_kv=True, groups=groups)
        out = self.model(step, cache)
        sizes = [len(c) for c in batch]
        keys, values = out.raw_keys.split(sizes, dim=2), out.raw_values.split(sizes, dim=2)
        return [KVEntry(c, k.clone(), v.clone(), self.meta("plain")) for c, k, v in zip(batch, keys, values)]

    def compute_fused(self, token_ids: TokenIds, neighbours: Sequence[KVEntry], neighbour_ids: Sequence[str]) -> KVEntry:
        """The chunk's KV computed after S0 and ``neighbours`` (most similar first) at consecutive positions."""
        s0, _ = self.prefix_entry(self.s0_ids)
        window = self.model.cfg.max_position_embeddings
        neighbours = list(neighbours)
        while neighbours and len(self.s0_ids) + sum(len(n.token_ids) for n in neighbours) + len(token_ids) > window:
            neighbours.pop()  # drop the least similar until the chunk fits the context window
        context = len(self.s0_ids) + sum(len(n.token_ids) for n in neighbours)
        cache = self.model.new_cache(context + len(token_ids))
        self.place(cache, s0, 0)
        position = len(self.s0_ids)
        for neighbour in neighbours:
            self.place(cache, neighbour, position)
            position += len(neighbour.token_ids)
        device = self.model.device
        ids = torch.tensor(token_ids, device=device)
        step = ForwardPass(ids, torch.arange(context, context + len(ids), device=device),
                           cache.reserve(len(ids)), logit_rows=ids[:0], capture_raw_kv=True)  # fmt: skip
        out = self.model(step, cache)
        meta = self.meta("fused", neighbours=list(neighbour_ids[: len(neighbours)]), requested=list(neighbour_ids))
        return KVEntry(tuple(token_ids), out.raw_keys.clone(), out.raw_values.clone(), meta)


def _batches(chunks: Sequence[TokenIds], max_tokens: int) -> list[list[TokenIds]]:
    batches: list[list[TokenIds]] = []
    current: list[TokenIds] = []
    for chunk in chunks:
        if current and sum(map(len, current)) + len(chunk) > max_tokens:
            batches.append(current)
            current = []
        current.append(chunk)
    if current:
        batches.append(current)
    return batches
