"""Plain and fused chunk entries: computing them (offline or on a miss) and finding them in the store.

A plain entry is a chunk's KV computed after the canonical prefix S0; a fused entry is its KV
computed after S0 and its neighbours' plain entries (FusionRAG eq. 10). Keys are stored before
rotary embedding, so an entry can be placed at any position of a later prompt.
"""

from __future__ import annotations

from typing import Sequence

import torch

from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM, ForwardPass
from fusionrag_llm.storage import KVEntry, TieredStore, chunk_key, path_key

TokenIds = tuple[int, ...]


class ChunkEntries:
    """Chunk entries of one model in one store, keyed by content (model, S0, tokens, variant)."""

    def __init__(self, model: DecoderLM, store: TieredStore, fingerprint: str, s0_ids: TokenIds):
        self.model = model
        self.store = store
        self.fingerprint = fingerprint
        self.s0_ids = tuple(s0_ids)

    def key(self, token_ids: Sequence[int], variant: str) -> str:
        return chunk_key(self.fingerprint, self.s0_ids, token_ids, variant)

    def lookup(self, token_ids: TokenIds, variant: str) -> tuple[KVEntry, str] | None:
        return self.store.get(self.key(token_ids, variant), expect_token_ids=token_ids, copy=False)

    def contains(self, token_ids: TokenIds, variant: str) -> bool:
        return self.key(token_ids, variant) in self.store

    def put(self, entry: KVEntry, variant: str) -> None:
        self.store.put(self.key(entry.token_ids, variant), entry)

    # ------------------------------------------------------------------ exact paths
    def path_key(self, *segments: Sequence[int]) -> str:
        return path_key(self.fingerprint, *segments)

    def prefix_entry(self, token_ids: TokenIds) -> tuple[KVEntry, bool]:
        """Exact KV of a prompt prefix run from position 0 (a path entry) and whether it was stored."""
        key = self.path_key(token_ids)
        found = self.store.get(key, expect_token_ids=token_ids, copy=False)
        if found is not None:
            return found[0], True
        entry = self.compute_exact(token_ids)
        self.store.put(key, entry)
        return entry, False

    def compute_exact(self, token_ids: TokenIds) -> KVEntry:
        cache = self.model.new_cache(len(token_ids))
        ids = torch.tensor(token_ids, device=self.model.device)
        positions = torch.arange(len(token_ids), device=self.model.device)
        step = ForwardPass(ids, positions, cache.reserve(len(ids)), logit_rows=ids[:0], capture_raw_kv=True)
        out = self.model(step, cache)
        return KVEntry(tuple(token_ids), out.raw_keys, out.raw_values, {"variant": "path"})

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
        return [KVEntry(c, k.clone(), v.clone(), {"variant": "plain"}) for c, k, v in zip(batch, keys, values)]

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
        meta = {"variant": "fused", "neighbours": list(neighbour_ids[: len(neighbours)]), "requested": list(neighbour_ids)}
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
