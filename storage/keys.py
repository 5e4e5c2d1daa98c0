"""Content-addressed store keys: sha256 over a canonical JSON encoding of what determines the KV.

Two entries get the same key only when everything that changes their tensors is equal: the model
(weights, config, tokenizer and compute dtype, folded into one fingerprint: a sha256 hex digest the
model side computes; this module only checks its form), the prefix the chunk was computed after,
the chunk's token ids, the variant and the fusion parameters.

Exact prefix-cache entries are path blocks keyed by a hash chain, as in a paged prefix cache:
block i's key hashes block i-1's key with block i's token ids, so every boundary key of a prompt
costs one pass over its tokens, not one pass per boundary. Path keys of format 2 replaced keys that
hashed every segment up to the boundary; blocks stored under those older keys are simply never
asked for again (a miss, computed once more).

Example:
    >>> fp = hashlib.sha256(b"a model").hexdigest()  # fusionrag_llm.models.fingerprint makes real ones
    >>> a = chunk_key(fp, prefix_ids=[1, 2], token_ids=[7, 8, 9], variant="plain")
    >>> a == chunk_key(fp, [1, 2], [7, 8, 9], "fused", {"neighbors": 2})
    False
    >>> len(a)
    64
    >>> first, second = path_keys(fp, [[1, 2], [7, 8, 9]])
    >>> second == path_block_key(fp, first, [7, 8, 9]) == path_key(fp, [1, 2], [7, 8, 9])
    True
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .entry import normalise_token_ids

KEY_FORMAT = 1  # chunk entries
PATH_KEY_FORMAT = 2  # chained path blocks
_VARIANT_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_HEX_KEY_RE = re.compile(r"[0-9a-f]{64}\Z")  # \Z: "$" would accept a trailing newline


def canonical_json(obj: Any) -> str:
    """One text per value: sorted keys, no spaces, ASCII, no NaN (`ValueError` otherwise)."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"value must be JSON-serialisable with str keys and no NaN: {exc}") from None


def _digest(payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(payload).encode("ascii")).hexdigest()


def _check_fingerprint(model_fingerprint: str) -> None:
    if not is_store_key(model_fingerprint):
        raise ValueError(
            f"model_fingerprint must be a sha256 hex digest (64 lowercase hex chars), got {model_fingerprint!r}"
        )


def chunk_key(
    model_fingerprint: str,
    prefix_ids: Sequence[int],
    token_ids: Sequence[int],
    variant: str,
    fusion: Mapping[str, Any] | None = None,
) -> str:
    """Key of a chunk entry: the chunk's KV computed after `prefix_ids` (the canonical prefix S0).

    `variant` is a short name (`plain`, `fused`, ...: letters, digits, `_.:-`); `fusion` holds the
    parameters that shaped a fused entry (neighbour ids, n, ...) and must be JSON-serialisable.
    """
    _check_fingerprint(model_fingerprint)
    if not isinstance(variant, str) or not _VARIANT_RE.match(variant):
        raise ValueError(f"variant must be 1-64 chars of letters, digits or '_.:-', got {variant!r}")
    if fusion is not None and not isinstance(fusion, Mapping):
        raise ValueError(f"fusion must be a mapping or None, got {type(fusion).__name__}")
    tokens = normalise_token_ids(token_ids)
    if not tokens:
        raise ValueError("token_ids must hold at least one token")
    payload = {
        "kind": "chunk",
        "format": KEY_FORMAT,
        "model": model_fingerprint,
        "prefix": list(normalise_token_ids(prefix_ids)),
        "tokens": list(tokens),
        "variant": variant,
        "fusion": dict(fusion) if fusion is not None else None,
    }
    return _digest(payload)


def path_block_key(model_fingerprint: str, previous: str | None, token_ids: Sequence[int]) -> str:
    """Key of one exact path block: the KV of ``token_ids`` run right after the path keyed ``previous``.

    ``previous`` is the key of the block before (``None`` for the block at position 0), so the key
    stands for the whole path while hashing only this block's tokens. Where a path is cut into
    blocks is part of the key: the same tokens cut elsewhere give other keys.
    """
    _check_fingerprint(model_fingerprint)
    if previous is not None and not is_store_key(previous):
        raise ValueError(f"previous must be None or the key of the block before, got {previous!r}")
    tokens = normalise_token_ids(token_ids)
    if not tokens:
        raise ValueError("every block of a path must hold at least one token")
    payload = {"kind": "path", "format": PATH_KEY_FORMAT, "model": model_fingerprint, "previous": previous,
               "tokens": list(tokens)}  # fmt: skip
    return _digest(payload)


def path_keys(model_fingerprint: str, blocks: Sequence[Sequence[int]]) -> list[str]:
    """Keys of every prefix of a path of ``blocks`` (each block's key chained on the one before)."""
    keys: list[str] = []
    for block in blocks:
        keys.append(path_block_key(model_fingerprint, keys[-1] if keys else None, block))
    return keys


def path_key(model_fingerprint: str, *blocks: Sequence[int]) -> str:
    """Key of the exact KV of ``blocks`` run back to back from position 0 (the last block's chain key).

    Blocks are e.g. the prefix, then each chunk with the text before it. Their order and their
    boundaries are part of the key (a path is a list of blocks, not just a token string).
    """
    if not blocks:
        raise ValueError("path_key needs at least one segment")
    return path_keys(model_fingerprint, blocks)[-1]


def is_store_key(key: Any) -> bool:
    """Whether `key` has the form of a store key: a str of 64 lowercase hex chars."""
    return type(key) is str and _HEX_KEY_RE.match(key) is not None


def check_key(key: Any) -> str:
    """Return `key` when it is a store key (64 lowercase hex chars), else raise `ValueError`."""
    if not is_store_key(key):
        raise ValueError(f"store keys are 64 lowercase hex chars (chunk_key/path_key), got {key!r}")
    return key
