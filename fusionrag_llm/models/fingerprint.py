"""A model's identity for the KV store: config, tokenizer, weights and compute dtype.

The fingerprint is a sha256 over a canonical JSON of those fields. It is computed here, on the
model side: the store's key scheme takes it as an opaque 64-hex digest and never needs to know
what a model is made of.

The weights part is a sha256 of the files' bytes, so another model's KV entries are never served.
Hashing is cheap for small models (SmolLM2-135M's 538 MB float32 safetensors: ~0.5 s with a warm
page cache) but not for large ones (tens of seconds for 14 GB), so a file's digest is remembered in
a memo in the user cache (``<cache_dir>/digests/``, not next to the weights: model folders and
site-packages may be read-only or shared). The memo holds the file's *stamp*: device, inode, size,
mtime_ns and ctime_ns. Size and mtime alone are not enough: ``cp -p``, ``tar -x`` and rsync give a
different file the old size and mtime. They cannot set ctime (the kernel sets it on every change
of the file or its metadata) and a copy is a new inode, so a memo copied along with the weights,
or written for another file, never matches. A file is not memoised when it changed less than
``RACY_SECONDS`` before hashing began or while it was hashed: with a coarse clock a later change
in the same tick would leave the stamp as it was (git's "racy clean" problem).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fusionrag_llm.paths import cache_dir

logger = logging.getLogger(__name__)

FINGERPRINT_FORMAT = 1  # bump to give every model new fingerprints (and so new store keys)
RACY_SECONDS = 2.0  # a little above the coarsest common timestamp granularity (FAT: 2 s)
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def weights_digest(folder: Path) -> str:
    """sha256 over the folder's safetensors files (each one's content digest, in name order)."""
    digest = hashlib.sha256()
    for file in sorted(Path(folder).glob("*.safetensors")):
        digest.update(file_digest(file).encode())
    return digest.hexdigest()


def file_digest(file: Path) -> str:
    """sha256 of ``file``'s bytes; taken from its memo only when the memo's stamp is the file's own."""
    file = Path(file)
    started_ns = time.time_ns()
    before = os.stat(file)
    remembered = _read_memo(file, _stamp(before))
    if remembered is not None:
        return remembered
    digest = _hash_bytes(file)
    after = os.stat(file)
    if _stamp(after) == _stamp(before) and started_ns - after.st_ctime_ns > RACY_SECONDS * 1e9:
        _write_memo(file, _stamp(after), digest)
    return digest


def _stamp(stat: os.stat_result) -> str:
    return f"{stat.st_dev}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}"


def _memo_path(file: Path) -> Path:
    name = hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:32]
    return cache_dir() / "digests" / f"{name}.json"


def _read_memo(file: Path, stamp: str) -> str | None:
    try:
        memo = json.loads(_memo_path(file).read_text())
        stamp_ok, digest = memo["stamp"] == stamp, memo["sha256"]
    except (OSError, ValueError, KeyError, TypeError):  # absent, unreadable, old format or garbage
        return None
    return digest if stamp_ok and isinstance(digest, str) and _HEX_DIGEST.fullmatch(digest) else None


def _write_memo(file: Path, stamp: str, digest: str) -> None:
    memo = _memo_path(file)
    partial = memo.with_name(f"{memo.name}.{os.getpid()}.partial")
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({"path": str(file.resolve()), "stamp": stamp, "sha256": digest}))
        os.replace(partial, memo)  # readers see the old memo or the new one, never half of one
    except OSError as exc:  # a read-only cache: hash again next time
        logger.debug("cannot remember the digest of %s (%s); it is hashed on every load", file, exc)
        with contextlib.suppress(OSError):
            partial.unlink()


def _hash_bytes(file: Path) -> str:
    with open(file, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def model_digest(
    model_id: str,
    dtype: torch.dtype | str,
    *,
    config: Mapping[str, Any] | None = None,
    tokenizer: str | None = None,
    weights: str | None = None,
) -> str:
    """Hex sha256 of a model's id, compute dtype, config, tokenizer identity and weights identity.

    Any difference gives another digest, and so other store keys for every entry.

    >>> model_digest("tiny", torch.float32) == model_digest("tiny", "float32")
    True
    """
    if not isinstance(model_id, str) or not model_id:
        raise ValueError(f"model_id must be a non-empty str, got {model_id!r}")
    payload = {
        "kind": "model",
        "format": FINGERPRINT_FORMAT,
        "model_id": model_id,
        "dtype": _dtype_name(dtype),
        "config": dict(config) if config is not None else None,
        "tokenizer": tokenizer,
        "weights": weights,
    }
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"a model's config must be JSON-serialisable with str keys and no NaN: {exc}") from None
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _dtype_name(dtype: torch.dtype | str) -> str:
    name = str(dtype).removeprefix("torch.") if isinstance(dtype, (torch.dtype, str)) else ""
    if not isinstance(getattr(torch, name, None), torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype or its name (e.g. 'bfloat16'), got {dtype!r}")
    return name


def fingerprint_of(name: str, source: str, hf_config: dict, tokenizer_hf, dtype: torch.dtype) -> str:
    """The store fingerprint of a loaded model: its tokenizer, weights, config and compute dtype."""
    vocab = json.dumps(sorted(tokenizer_hf.get_vocab().items()))
    template = getattr(tokenizer_hf, "chat_template", "") or ""
    tokenizer_id = hashlib.sha256((vocab + template).encode()).hexdigest()
    weights = weights_digest(Path(source)) if source != "built-in" else f"built-in:{name}"
    config = {k: v for k, v in hf_config.items() if not k.startswith("_") and k != "transformers_version"}
    return model_digest(name if source == "built-in" else "model", dtype, config=config,
                        tokenizer=tokenizer_id, weights=weights)  # fmt: skip
