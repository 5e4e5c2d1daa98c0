"""The ``kv_codec`` setting: how a store keeps chunk KV (a float dtype, or a quantized codec), and the
codec a store folder records.

A float codec keeps the tensors in that dtype (the store's ``storage_dtype``, raw codec); a
quantized one packs them with scales (``QuantCodec``). Either way the model computes in its
own dtype: entries are cast or expanded on the way to it. A store whose KV is not the compute
dtype's exact numbers (every codec but the compute dtype itself) gets keys of its own and holds no
exact chunk entries (``fusion/entry_keys.py``); a float codec's store still keeps exact path
blocks, in the compute dtype.

``"model"`` names the compute dtype itself (exact entries).

The codec is part of every entry key: an engine that opened a store with another codec than the
one its entries were written with would find none of them and silently recompute everything. So
a store folder records its codec in ``kv_codec.json`` when it is created, and an engine that is
not told a codec adopts the recorded one:

* no codec given: the recorded one; for a folder made before stores recorded their codec (it
  already holds entries), ``"model"`` (the compute dtype, the only codec there was); for a new
  folder, ``DEFAULT_KV_CODEC``;
* a codec given: that one. Its entries live under keys of their own, beside the others; the record
  keeps the codec the folder was created with, and the difference is logged.

The file is plain JSON (``{"kv_codec": "bf16"}``), written once and atomically; a store folder is
untrusted, so a record that is not one of the allowed names is an error naming the file and the fix.

Example:
    >>> resolve_kv_codec("bf16")
    ('bfloat16', 'raw')
    >>> resolve_kv_codec("int4")
    (None, 'int4.2')
    >>> resolve_kv_codec("model")
    (None, 'raw')
    >>> resolve_kv_codec("int3")
    Traceback (most recent call last):
    ...
    fusionrag_llm.storage.errors.StoreConfigError: kv_codec 'int3' is not supported; allowed: model, float32, bf16, fp16, int8, fp8, int4
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> store_kv_codec(folder, None)
    'bf16'
    >>> store_kv_codec(folder, "int8")  # given: used, the record stays
    'int8'
    >>> recorded_kv_codec(folder)
    'bf16'
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from .errors import StoreConfigError
from .no_follow import opener

# name -> (storage dtype, store codec id); bytes per token on SmolLM2-135M in docs/BENCHMARKS.md
KV_CODECS: dict[str, tuple[str | None, str]] = {
    "model": (None, "raw"),  # the compute dtype: exact
    "float32": ("float32", "raw"),
    "bf16": ("bfloat16", "raw"),
    "fp16": ("float16", "raw"),
    "int8": (None, "int8"),
    "fp8": (None, "fp8"),
    "int4": (None, "int4.2"),  # values grouped by 16 channels (quantize.py)
}
DEFAULT_KV_CODEC = "bf16"  # what a new store keeps: half of float32's bytes, no exact path block lost
_ALIASES = {"fp32": "float32", "bfloat16": "bf16", "float16": "fp16"}
CODEC_FILE = "kv_codec.json"
LEGACY_CODEC = "model"  # what stores made before the record kept: the compute dtype
_STORE_FILES = ("cache.db", "catalog.jsonl")  # a folder holding one of these already is a store
logger = logging.getLogger(__name__)


def check_kv_codec(kv_codec: str) -> str:
    """The canonical name of ``kv_codec``; ``StoreConfigError`` listing the allowed ones otherwise."""
    name = _ALIASES.get(kv_codec.lower(), kv_codec.lower()) if isinstance(kv_codec, str) else None
    if name not in KV_CODECS:
        raise StoreConfigError(f"kv_codec {kv_codec!r} is not supported; allowed: {', '.join(KV_CODECS)}")
    return name


def resolve_kv_codec(kv_codec: str) -> tuple[str | None, str]:
    """``(storage dtype name or None, store codec id)`` of ``kv_codec``."""
    return KV_CODECS[check_kv_codec(kv_codec)]


def recorded_kv_codec(folder: Path) -> str | None:
    """The codec ``folder`` records, None when it records none; ``StoreConfigError`` for a damaged record."""
    path = Path(folder) / CODEC_FILE
    try:  # never through a link, never a FIFO: the folder is untrusted
        with open(path, "rb", opener=opener) as handle:
            text = handle.read().decode("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad_record(path, f"cannot be read ({exc})") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise _bad_record(path, "is not JSON") from None
    name = data.get("kv_codec") if isinstance(data, dict) else None
    if not isinstance(name, str) or name not in KV_CODECS:
        raise _bad_record(path, f"names no allowed codec (got {name!r}; allowed: {', '.join(KV_CODECS)})")
    return name


def store_kv_codec(folder: Path, requested: str | None) -> str:
    """The codec an engine opening ``folder`` uses (``requested`` when given); records it in a folder
    that records none yet (a folder that cannot be written stays unrecorded)."""
    folder = Path(folder)
    requested = None if requested is None else check_kv_codec(requested)
    recorded = recorded_kv_codec(folder)
    if recorded is not None:
        if requested is not None and requested != recorded:
            logger.info("store %s records kv_codec %r; this engine keeps %r entries (keys of their own)",
                        folder, recorded, requested)  # fmt: skip
        return requested or recorded
    existing = any((folder / name).exists() for name in _STORE_FILES)
    chosen = requested or (LEGACY_CODEC if existing else DEFAULT_KV_CODEC)
    _record(folder, LEGACY_CODEC if existing else chosen)
    return chosen


def _record(folder: Path, name: str) -> None:
    """Write the record atomically (a concurrent opener sees the whole file or none); first writer wins."""
    target = folder / CODEC_FILE
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".kv_codec.", suffix=".tmp")
    except OSError as exc:  # a folder without write access: the store opens read-only, unrecorded
        logger.debug("cannot record kv_codec in %s: %s", folder, exc)
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"kv_codec": name}, handle)
        os.link(tmp, target)  # fails if another process recorded first: its record stands
    except FileExistsError:
        pass
    except OSError as exc:
        logger.debug("cannot record kv_codec in %s: %s", folder, exc)
    finally:
        os.unlink(tmp)


def _bad_record(path: Path, problem: str) -> StoreConfigError:
    return StoreConfigError(
        f"the store's codec record {str(path)!r} {problem}; delete that file to adopt the codec given "
        f"(kv_codec= / --engine-option kv_codec=), which must be the one the store's entries were written with"
    )
