"""Computing entries with the model: exact prefixes, plain chunk entries, fused chunk entries.

A plain entry is a chunk's KV computed after the canonical prefix S0; a fused entry is its KV
computed after S0 and its neighbours' plain entries (FusionRAG eq. 10). Keys are kept before
rotary embedding, so an entry can be placed at any position of a later prompt.

A lossy store cannot hold exact KV, so exact prompt prefixes are then kept in a ``PrefixCache``
instead (``models/prefix_cache.py``: blocks on the model's device, least recently used dropped first):
the one the engine hands every tenant's computer (its turn cache, else one of ``PREFIX_MEMO_BYTES``),
or, for a computer given none (an ingestion worker's), one of its own.
"""

from __future__ import annotations

from typing import Sequence

import torch

from fusionrag_llm.fusion.craft import META_KEY, NotesRecorder
from fusionrag_llm.fusion.entry_keys import EntryKeys, TokenIds
from fusionrag_llm.fusion.entry_store import EntryStore
from fusionrag_llm.fusion.placement import place_entry
from fusionrag_llm.models.llama import DecoderLM, ForwardPass
from fusionrag_llm.models.prefix_cache import EXACT, PrefixCache
from fusionrag_llm.storage import KVEntry

PREFIX_MEMO_BYTES = 256 << 20  # exact prompt prefixes kept on the device when the store is lossy


class EntryComputer:
    """Runs the model to make entries; the S0 entry they all start from comes from ``prefix_entry``.

    ``prefixes``: where a lossy store's exact prefixes are kept, under ``namespace`` (the tenant's
    exact one); None: a cache of this computer's own, made when first needed."""

    def __init__(self, model: DecoderLM, keys: EntryKeys, entry_store: EntryStore,
                 prefixes: PrefixCache | None = None, namespace: str = EXACT):  # fmt: skip
        self.model = model
        self.keys = keys
        self.entry_store = entry_store
        self.prefixes, self.namespace = prefixes, namespace

    def prefix_entry(self, token_ids: TokenIds) -> tuple[KVEntry, int]:
        """Exact KV of a prompt prefix run from position 0 and how many of its tokens were computed.

        A store keeps it as the first block of a path, in the compute dtype; one of a quantizing
        codec holds no exact KV, so it is kept in the prefix cache, where the longest kept start of it
        (an earlier prefix, a chat's earlier turn) is read and only the rest computed.
        """
        if not self.keys.exact_blocks:
            return self._memo_prefix(tuple(token_ids))
        key = self.keys.path_block_key(None, token_ids)
        found = self.entry_store.fetch(key, token_ids, "path")
        if found is not None:
            return found[0], 0
        entry = self.compute_exact(token_ids)
        self.entry_store.put_block(key, entry)
        return entry, len(token_ids)

    def _memo_prefix(self, token_ids: TokenIds) -> tuple[KVEntry, int]:
        if self.prefixes is None:
            self.prefixes = PrefixCache(PREFIX_MEMO_BYTES)
        hit = self.prefixes.lookup(token_ids, [self.namespace], len(token_ids))
        kept = None if hit is None else KVEntry(token_ids[: hit.length], hit.keys, hit.values, self.keys.meta("path"))
        if kept is not None and hit.length == len(token_ids):
            return kept, 0
        entry = self.compute_exact(token_ids, kept)
        self.prefixes.remember(token_ids, entry.keys, entry.values, self.namespace)  # skips the blocks it holds
        return entry, len(token_ids) - (0 if kept is None else hit.length)

    def compute_exact(self, token_ids: TokenIds, kept: KVEntry | None = None) -> KVEntry:
        """KV of ``token_ids`` run from position 0 with nothing before them; ``kept``: the exact KV of a
        start of them, read instead of computed."""
        start = 0 if kept is None else len(kept.token_ids)
        cache = self.model.new_cache(len(token_ids))
        if kept is not None:
            place_entry(self.model, cache, kept, 0)
        ids = torch.tensor(token_ids[start:], device=self.model.device)
        positions = torch.arange(start, len(token_ids), device=self.model.device)
        step = ForwardPass(ids, positions, cache.reserve(len(ids)), logit_rows=ids[:0], capture_raw_kv=True)
        out = self.model(step, cache)
        keys, values = out.raw_keys, out.raw_values
        if kept is not None:
            keys, values = torch.cat([kept.keys.to(keys), keys], dim=2), torch.cat([kept.values.to(values), values], dim=2)
        return KVEntry(tuple(token_ids), keys, values, self.keys.meta("path"))

    def compute_plain(self, chunks: Sequence[TokenIds], max_batch_tokens: int = 2048) -> list[KVEntry]:
        """Plain entries of ``chunks``; several chunks share one forward pass (each sees S0 and itself)."""
        entries: list[KVEntry] = []
        for batch in _batches(chunks, max_batch_tokens):
            entries.extend(self._plain_batch(batch))
        return entries

    def _plain_batch(self, batch: Sequence[TokenIds]) -> list[KVEntry]:
        s0, _ = self.prefix_entry(self.keys.s0_ids)
        start = len(self.keys.s0_ids)
        cache = self.model.new_cache(start + sum(map(len, batch)))
        place_entry(self.model, cache, s0, 0)
        device = self.model.device
        ids = torch.tensor([t for chunk in batch for t in chunk], device=device)
        positions = torch.cat([torch.arange(start, start + len(c), device=device) for c in batch])
        groups = torch.cat([torch.full((len(c),), i + 1, dtype=torch.int32, device=device) for i, c in enumerate(batch)])
        step = ForwardPass(ids, positions, cache.reserve(len(ids)), logit_rows=ids[:0], capture_raw_kv=True, groups=groups)
        out = self.model(step, cache)
        sizes = [len(c) for c in batch]
        keys, values = out.raw_keys.split(sizes, dim=2), out.raw_values.split(sizes, dim=2)
        return [KVEntry(c, k.clone(), v.clone(), self.keys.meta("plain")) for c, k, v in zip(batch, keys, values)]

    def compute_fused(self, token_ids: TokenIds, neighbours: Sequence[KVEntry], neighbour_ids: Sequence[str],
                      notes: bool = False) -> KVEntry:  # fmt: skip
        """The chunk's KV computed after S0 and ``neighbours`` (given most similar first) at consecutive
        positions, the most similar first (the paper's layout).

        ``notes``: also measure Cache-Craft's notes on it (``fusion/craft.py``; kept in its meta). They
        cost one more attention pass per layer, about 70% more time for a 600-token chunk after nine."""
        return self.compute_fused_many([(token_ids, neighbours, neighbour_ids)], notes)[0]

    def compute_fused_many(self, jobs: Sequence[tuple[TokenIds, Sequence[KVEntry], Sequence[str]]],
                           notes: bool = False) -> list[KVEntry]:  # fmt: skip
        """``compute_fused`` of each (token ids, neighbours, neighbour ids) in ``jobs``, all in one forward
        (each chunk over its own cache): one pass through the weights for several chunks. The numbers
        match one chunk per pass up to the last bits of float arithmetic (ingestion batches them on a GPU
        only, see ``fusion/offline.py``)."""
        s0, _ = self.prefix_entry(self.keys.s0_ids)
        device, steps, caches, parts = self.model.device, [], [], []
        for token_ids, neighbours, neighbour_ids in jobs:
            neighbours = self._fitting(token_ids, neighbours)
            used = list(neighbour_ids[: len(neighbours)])
            context = len(self.keys.s0_ids) + sum(len(n.token_ids) for n in neighbours)
            cache = self.model.new_cache(context + len(token_ids))
            place_entry(self.model, cache, s0, 0)
            position, spans = len(self.keys.s0_ids), []
            for neighbour in neighbours:
                place_entry(self.model, cache, neighbour, position)
                spans.append((position, position + len(neighbour.token_ids)))
                position += len(neighbour.token_ids)
            ids = torch.tensor(token_ids, device=device)
            recorder = NotesRecorder(used, spans, (context, context + len(ids))) if notes else None
            steps.append(ForwardPass(ids, torch.arange(context, context + len(ids), device=device),
                                     cache.reserve(len(ids)), logit_rows=ids[:0], capture_raw_kv=True,
                                     hooks=(recorder,) if recorder is not None else ()))  # fmt: skip
            caches.append(cache)
            parts.append((token_ids, neighbour_ids, used, recorder))
        entries = []
        for out, (token_ids, neighbour_ids, used, recorder) in zip(self.model.forward_batch(steps, caches), parts):
            extra = {META_KEY: recorder.notes().to_meta()} if recorder is not None else {}
            meta = self.keys.meta("fused", neighbours=used, requested=list(neighbour_ids), **extra)
            entries.append(KVEntry(tuple(token_ids), out.raw_keys.clone(), out.raw_values.clone(), meta))
        return entries

    def _fitting(self, token_ids: TokenIds, neighbours: Sequence[KVEntry]) -> list[KVEntry]:
        """The most similar neighbours that fit the context window with S0 and the chunk."""
        window = self.model.cfg.max_position_embeddings
        kept = list(neighbours)
        while kept and len(self.keys.s0_ids) + sum(len(n.token_ids) for n in kept) + len(token_ids) > window:
            kept.pop()  # drop the least similar first
        return kept


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
