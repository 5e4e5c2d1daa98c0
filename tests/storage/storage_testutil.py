"""Helpers shared by the storage tests and the subprocesses they start (importable by path)."""

from __future__ import annotations

import torch

from fusionrag_llm.models.fingerprint import model_digest
from fusionrag_llm.storage import KVEntry, chunk_key

FINGERPRINT = model_digest("tiny-test", "float32")
PREFIX = (1, 2, 3)


def make_entry(
    seed: int,
    num_tokens: int = 4,
    dtype: torch.dtype = torch.float32,
    layers: int = 2,
    heads: int = 2,
    head_dim: int = 8,
) -> KVEntry:
    """A deterministic entry: the same seed and shape always give the same bits."""
    gen = torch.Generator().manual_seed(seed)
    shape = (layers, heads, num_tokens, head_dim)
    keys = torch.randn(shape, generator=gen).to(dtype)
    values = torch.randn(shape, generator=gen).to(dtype)
    token_ids = tuple(1000 + seed * 7 + i for i in range(num_tokens))
    return KVEntry(token_ids, keys, values, {"variant": "plain", "seed": seed})


def key_for(seed: int, num_tokens: int = 4) -> str:
    """The store key of `make_entry(seed, num_tokens)`."""
    token_ids = [1000 + seed * 7 + i for i in range(num_tokens)]
    return chunk_key(FINGERPRINT, PREFIX, token_ids, "plain")
