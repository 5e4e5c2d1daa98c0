"""Plain and fused chunk entries: computing them (offline or on a miss) and finding them in the store.

A plain entry is a chunk's KV computed after the canonical prefix S0; a fused entry is its KV
computed after S0 and its neighbours' plain entries (FusionRAG eq. 10). Keys are stored before
rotary embedding, so an entry can be placed at any position of a later prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.llama import DecoderLM, ForwardPass
from fusionrag_llm.models.rotary import apply_rotary
from fusionrag_llm.storage import KVEntry, TieredStore, chunk_key

TokenIds = tuple[int, ...]
MAX_CACHED_PREFIXES = 32  # exact prefixes kept in memory, least recently used dropped first


@dataclass
class ExactKV:
    """Exact KV of a token path run from position 0 (rotary applied): a prefix-cache entry."""

    token_ids: TokenIds
    keys: torch.Tensor  # [layers, kv_heads, n, head_dim], rotated at positions 0..n-1
    values: torch.Tensor


class ChunkEntries:
    """Chunk entries of one model in one store, keyed by content (model, S0, tokens, variant)."""

    def __init__(self, model: DecoderLM, store: TieredStore, fingerprint: str, s0_ids: TokenIds):
        self.model = model
        self.store = store
        self.fingerprint = fingerprint
        self.s0_ids = tuple(s0_ids)
        self._prefixes: OrderedDict[TokenIds, ExactKV] = OrderedDict()

    def key(self, token_ids: Sequence[int], variant: str) -> str:
        return chunk_key(self.fingerprint, self.s0_ids, token_ids, variant)

    def lookup(self, token_ids: TokenIds, variant: str) -> tuple[KVEntry, str] | None:
        return self.store.get(self.key(token_ids, variant), expect_token_ids=token_ids, copy=False)

    def contains(self, token_ids: TokenIds, variant: str) -> bool:
        return self.key(token_ids, variant) in self.store

    def put(self, entry: KVEntry, variant: str) -> None:
        self.store.put(self.key(entry.token_ids, variant), entry)

    # ------------------------------------------------------------------ exact prefixes
    def prefix_kv(self, token_ids: TokenIds) -> tuple[ExactKV, bool]:
        """Exact KV of a prompt prefix and whether it was already cached."""
        cached = self._prefixes.get(token_ids)
        if cached is not None:
            self._prefixes.move_to_end(token_ids)
            return cached, True
        cache = self.model.new_cache(len(token_ids))
        ids = torch.tensor(token_ids, device=self.model.device)
        positions = torch.arange(len(token_ids), device=self.model.device)
        self.model(ForwardPass(ids, positions, cache.reserve(len(ids)), logit_rows=ids[:0]), cache)
        exact = ExactKV(tuple(token_ids), cache.keys.clone(), cache.values.clone())
        self._prefixes[exact.token_ids] = exact
        while len(self._prefixes) > MAX_CACHED_PREFIXES:
            self._prefixes.popitem(last=False)
        return exact, False

    def place_exact(self, cache: KVCache, exact: ExactKV) -> None:
        """Copy an exact prefix into the first slots of an empty request cache."""
        slots = cache.reserve(len(exact.token_ids))
        cache.keys[:, :, slots] = exact.keys
        cache.values[:, :, slots] = exact.values
        cache.positions[slots] = torch.arange(len(slots), device=slots.device)
        cache.valid[slots] = True

    def place(self, cache: KVCache, entry: KVEntry, start_position: int) -> torch.Tensor:
        """Put ``entry`` into the next slots at consecutive positions from ``start_position``."""
        slots = cache.reserve(len(entry.token_ids))
        positions = torch.arange(start_position, start_position + len(slots), device=slots.device)
        cos, sin = self.model.rotary_cos_sin(positions)
        keys = entry.keys.to(device=cache.keys.device, dtype=cache.keys.dtype)
        cache.keys[:, :, slots] = apply_rotary(keys, cos, sin)
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
        s0, _ = self.prefix_kv(self.s0_ids)
        start = len(self.s0_ids)
        cache = self.model.new_cache(start + sum(map(len, batch)))
        self.place_exact(cache, s0)
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
        s0, _ = self.prefix_kv(self.s0_ids)
        window = self.model.cfg.max_position_embeddings
        neighbours = list(neighbours)
        while neighbours and len(self.s0_ids) + sum(len(n.token_ids) for n in neighbours) + len(token_ids) > window:
            neighbours.pop()  # drop the least similar until the chunk fits the context window
        context = len(self.s0_ids) + sum(len(n.token_ids) for n in neighbours)
        cache = self.model.new_cache(context + len(token_ids))
        self.place_exact(cache, s0)
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
