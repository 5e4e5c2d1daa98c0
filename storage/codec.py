"""Bytes encoding of a `KVEntry` with a checksum, so a damaged entry is detected, never served.

Layout (little-endian):

    magic b"FRKV" | version u16 | header length u32 | header JSON (utf-8)
    | keys bytes | values bytes | blake2b-256 digest of everything before it

The header holds dtype, shape, byte order, token ids, meta and (version 2) the store key the entry
was written under. The tiers always write the key and check it on read: a valid entry filed under
another key (rows or files swapped) is then a miss, not a wrong answer, and an entry file alone says
which key it belongs to, so a lost index can be rebuilt from the files. `encode`/`decode` still work
without a key for callers that have none. Bytes of another codec version raise `StaleEntryError`
(a `CorruptEntryError`): such entries are recomputed, never misread. Tensors are raw bytes in their
storage dtype (bf16 and fp16 bits are kept exactly; bytes are taken through a uint8 view since numpy
has no bfloat16).

Example:
    >>> import torch
    >>> from fusionrag_llm.storage.entry import KVEntry
    >>> e = KVEntry((1, 2), torch.ones(1, 1, 2, 4, dtype=torch.bfloat16), torch.zeros(1, 1, 2, 4, dtype=torch.bfloat16))
    >>> decode(encode(e)).bitwise_equal(e)
    True
    >>> key, entry = decode_keyed(encode(e, key="ab" * 32))
    >>> key == "ab" * 32, entry.bitwise_equal(e)
    (True, True)
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from collections.abc import Iterable

import torch

from .entry import KVEntry
from .keys import is_store_key

MAGIC = b"FRKV"
VERSION = 2  # 2: the header carries the store key
DIGEST_BYTES = 32
_PREAMBLE = struct.Struct("<4sHI")  # magic, version, header length
_MAX_HEADER_BYTES = 64 * 2**20

_DTYPE_NAMES = (
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8",
)
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in _DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)
}


class CorruptEntryError(ValueError):
    """Stored bytes are not a valid entry: bad magic or version, truncated, or checksum mismatch."""


class StaleEntryError(CorruptEntryError):
    """Bytes of another codec version: not damaged, but not readable by this build (recompute them)."""


def dtype_name(dtype: torch.dtype) -> str:
    """The codec's name of a storage dtype; `ValueError` for dtypes it cannot store."""
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"storage dtype {dtype} is not supported; allowed: {', '.join(DTYPES)}")


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    # uint8 view of a contiguous CPU tensor: works for every dtype, bf16 included.
    return memoryview(tensor.detach().cpu().contiguous().view(torch.uint8).numpy()).cast("B")


def _digest(parts: Iterable[bytes | memoryview]) -> bytes:
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for part in parts:
        digest.update(part)
    return digest.digest()


def encode(entry: KVEntry, storage_dtype: torch.dtype | None = None, *, key: str | None = None) -> bytes:
    """Bytes of `entry`, tensors cast to `storage_dtype` when given (e.g. fp16 on disk, fp32 compute).

    `key` (a 64-hex store key) is written into the checked header; the store's tiers always pass it.
    """
    if key is not None and not is_store_key(key):
        raise ValueError(f"key must be a store key (64 lowercase hex chars) or None, got {key!r}")
    dtype = entry.dtype if storage_dtype is None else storage_dtype
    header = {
        "dtype": dtype_name(dtype),
        "shape": list(entry.keys.shape),
        "byteorder": sys.byteorder,
        "token_ids": list(entry.token_ids),
        "meta": entry.meta,
        "key": key,
    }
    header_bytes = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    parts = [
        _PREAMBLE.pack(MAGIC, VERSION, len(header_bytes)),
        header_bytes,
        _tensor_bytes(entry.keys.to(dtype)),
        _tensor_bytes(entry.values.to(dtype)),
    ]
    parts.append(_digest(parts))
    return b"".join(parts)


def _check_frame(view: memoryview) -> int:
    """Validate magic, version, length and checksum; return the header length."""
    if len(view) < _PREAMBLE.size + DIGEST_BYTES:
        raise CorruptEntryError(f"entry truncated: {len(view)} bytes is shorter than the fixed frame")
    magic, version, header_len = _PREAMBLE.unpack_from(view, 0)
    if magic != MAGIC:
        raise CorruptEntryError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        age = "an older" if version < VERSION else "a newer"
        raise StaleEntryError(f"entry was written by {age} codec (version {version}), this build reads {VERSION}")
    if header_len > _MAX_HEADER_BYTES or _PREAMBLE.size + header_len + DIGEST_BYTES > len(view):
        raise CorruptEntryError(f"entry truncated: header of {header_len} bytes does not fit")
    if _digest([view[:-DIGEST_BYTES]]) != bytes(view[-DIGEST_BYTES:]):
        raise CorruptEntryError("checksum mismatch: entry bytes were modified or truncated")
    return header_len


def _parse_header(raw: memoryview) -> tuple[torch.dtype, tuple[int, ...], dict]:
    try:
        header = json.loads(bytes(raw).decode("utf-8"))
        dtype = DTYPES[header["dtype"]]
        shape = tuple(int(d) for d in header["shape"])
        byteorder = header["byteorder"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptEntryError(f"unreadable header: {exc}") from None
    if byteorder != sys.byteorder:
        raise CorruptEntryError(f"entry was written {byteorder}-endian, this machine is {sys.byteorder}")
    if len(shape) != 4 or min(shape) < 1:
        raise CorruptEntryError(f"bad tensor shape {shape} in header")
    key = header.get("key")
    if key is not None and not is_store_key(key):
        raise CorruptEntryError(f"header key {key!r} is not a store key")
    return dtype, shape, header


def decode(data: bytes | bytearray | memoryview, dtype: torch.dtype | None = None) -> KVEntry:
    """The entry encoded in `data` (CPU tensors), cast to `dtype` when given; see `decode_keyed`."""
    return decode_keyed(data, dtype)[1]


def decode_keyed(data: bytes | bytearray | memoryview, dtype: torch.dtype | None = None) -> tuple[str | None, KVEntry]:
    """`(key written in the header or None, entry)` of `data`, tensors cast to `dtype` when given.

    Raises `CorruptEntryError` on bad magic, truncation or checksum mismatch, and its subclass
    `StaleEntryError` for bytes of another codec version.
    """
    view = memoryview(data).cast("B")
    header_len = _check_frame(view)
    start = _PREAMBLE.size + header_len
    stored_dtype, shape, header = _parse_header(view[_PREAMBLE.size : start])
    numel = shape[0] * shape[1] * shape[2] * shape[3]
    tensor_bytes = numel * torch.empty((), dtype=stored_dtype).element_size()
    if start + 2 * tensor_bytes + DIGEST_BYTES != len(view):
        raise CorruptEntryError(
            f"entry length {len(view)} does not match header (shape {shape}, {header['dtype']})"
        )
    buffer = bytearray(view[start : start + 2 * tensor_bytes])  # one copy, owned by the tensors
    keys = torch.frombuffer(buffer, dtype=stored_dtype, count=numel, offset=0).view(shape)
    values = torch.frombuffer(buffer, dtype=stored_dtype, count=numel, offset=tensor_bytes).view(shape)
    if dtype is not None and dtype != stored_dtype:
        keys, values = keys.to(dtype), values.to(dtype)
    try:
        return header.get("key"), KVEntry(tuple(header["token_ids"]), keys, values, header.get("meta", {}))
    except (ValueError, KeyError) as exc:
        raise CorruptEntryError(f"header does not describe a valid entry: {exc}") from None
