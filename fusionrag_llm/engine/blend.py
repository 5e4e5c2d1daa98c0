"""The blend of a chunk's fused and plain entries (``chunk_kv="blend"``, the default method's KV).

A chunk's fused entry saw neighbours that may not be in this prompt, its plain entry saw none of the
chunks before it; each is wrong in its own way. The blend places the mix of the two: ``BLEND`` times
the fused entry's K/V plus the rest times the plain one's, mixed before placement (rotary embedding is
linear, so the placed keys are the mix of the two placed ones). A chunk whose fused entry was computed
in this prompt's own context (``context_in_place``: its neighbours ahead of it, most similar first) keeps
its fused entry alone.

    >>> context_in_place({"neighbours": ["a", "b"]}, ahead=["a", "x", "b"])
    True
    >>> context_in_place({"neighbours": ["a", "b"]}, ahead=["b", "a"])
    False
"""

from __future__ import annotations

from typing import Sequence

import torch

from fusionrag_llm.storage import KVEntry, kv_tensors

BLEND = 0.5  # measured against 0.3 and 0.7 on the shared questions (docs/BENCHMARKS.md)


def blend_entry(fused: KVEntry, plain: KVEntry, device: torch.device, dtype: torch.dtype) -> KVEntry:
    """The blend of a chunk's two entries, unpacked on ``device`` in ``dtype``, with ``fused``'s meta
    (the chunk stays counted as a fused hit)."""
    fused_keys, fused_values = kv_tensors(fused, device, dtype)
    plain_keys, plain_values = kv_tensors(plain, device, dtype)
    return KVEntry(fused.token_ids, torch.lerp(plain_keys, fused_keys, BLEND),
                   torch.lerp(plain_values, fused_values, BLEND), fused.meta)  # fmt: skip


def context_in_place(meta: dict, ahead: Sequence[str]) -> bool:
    """Whether every neighbour a fused entry (``meta``) was computed after is in ``ahead`` (the catalog
    ids of the chunks before its chunk in a request, in prompt order), in the order it saw them (other
    chunks may sit between them)."""
    neighbours = list(meta.get("neighbours") or [])
    where = {chunk_id: index for index, chunk_id in enumerate(ahead)}
    if any(n not in where for n in neighbours):
        return False
    return all(where[a] < where[b] for a, b in zip(neighbours, neighbours[1:]))
