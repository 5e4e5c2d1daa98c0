"""The checked frame around every stored entry, whatever codec wrote its payload.

Layout (little-endian):

    magic b"FRKV" | version u16 | header length u32 | header JSON (utf-8) | payload
    | blake2b-256 digest of everything before it

The frame owns every check that keeps a damaged or foreign entry from being served, so a codec
cannot weaken them: magic, version, lengths, the checksum over all bytes, a JSON-object header and
the store key the entry was written under (`key`, checked to be a store key). A codec only turns
its own header fields and the payload into tensors and back.

Versions: 2 holds the `raw` codec's entries and names no codec (the bytes written before codecs
were pluggable, kept byte-identical so stores and older builds sharing them still read them); 3
names its codec in the header's `codec` field. Older builds read version 3 as stale (recompute), so
an entry of a codec they do not have is never misread. Any other version is `StaleEntryError`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .keys import is_store_key

MAGIC = b"FRKV"
RAW_CODEC_ID = "raw"
RAW_VERSION = 2  # the raw codec's frames: no `codec` field in the header
CODEC_VERSION = 3  # frames that name their codec
VERSIONS = (RAW_VERSION, CODEC_VERSION)
DIGEST_BYTES = 32
RESERVED_FIELDS = ("codec", "key")
_PREAMBLE = struct.Struct("<4sHI")  # magic, version, header length
_MAX_HEADER_BYTES = 64 * 2**20


class CorruptEntryError(ValueError):
    """Stored bytes are not a valid entry: bad magic or version, truncated, or checksum mismatch."""


class StaleEntryError(CorruptEntryError):
    """Bytes of another format version or codec: not damaged, but not for this reader (recompute them)."""


@dataclass(frozen=True)
class Frame:
    """A frame that passed every check: its codec, key (None when written without one), the
    codec's header fields (reserved ones removed) and the payload bytes."""

    codec_id: str
    key: str | None
    header: dict
    payload: memoryview


def _digest(parts: Iterable[bytes | memoryview]) -> bytes:
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for part in parts:
        digest.update(part)
    return digest.digest()


def pack_frame(codec_id: str, header: dict, payload: Sequence[bytes | memoryview], *, key: str | None) -> bytes:
    """Frame `payload` with the codec's `header` fields, the codec id (unless raw) and `key`."""
    if key is not None and not is_store_key(key):
        raise ValueError(f"key must be a store key (64 lowercase hex chars) or None, got {key!r}")
    reserved = [name for name in RESERVED_FIELDS if name in header]
    if reserved:
        raise ValueError(f"codec header fields {reserved} are reserved for the frame; use other names")
    version = RAW_VERSION if codec_id == RAW_CODEC_ID else CODEC_VERSION
    named = {} if version == RAW_VERSION else {"codec": codec_id}
    fields = {**named, **header, "key": key}
    header_bytes = json.dumps(fields, separators=(",", ":"), allow_nan=False).encode("utf-8")
    parts = [_PREAMBLE.pack(MAGIC, version, len(header_bytes)), header_bytes, *payload]
    parts.append(_digest(parts))
    return b"".join(parts)


def _check_frame(view: memoryview) -> tuple[int, int]:
    """Validate magic, version, length and checksum; return `(version, header length)`."""
    version, header_len = _check_preamble(view)
    if _digest([view[:-DIGEST_BYTES]]) != bytes(view[-DIGEST_BYTES:]):
        raise CorruptEntryError("checksum mismatch: entry bytes were modified or truncated")
    return version, header_len


def _check_preamble(view: memoryview) -> tuple[int, int]:
    """Validate magic, version and length (not the checksum); return `(version, header length)`."""
    if len(view) < _PREAMBLE.size + DIGEST_BYTES:
        raise CorruptEntryError(f"entry truncated: {len(view)} bytes is shorter than the fixed frame")
    magic, version, header_len = _PREAMBLE.unpack_from(view, 0)
    if magic != MAGIC:
        raise CorruptEntryError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version not in VERSIONS:
        age = "an older" if version < min(VERSIONS) else "a newer"
        raise StaleEntryError(f"entry was written by {age} codec (version {version}), this build reads {VERSIONS}")
    if header_len > _MAX_HEADER_BYTES or _PREAMBLE.size + header_len + DIGEST_BYTES > len(view):
        raise CorruptEntryError(f"entry truncated: header of {header_len} bytes does not fit")
    return version, header_len


def _parse_header(raw: memoryview, version: int) -> tuple[str, str | None, dict]:
    try:
        header = json.loads(bytes(raw).decode("utf-8"))
    except ValueError as exc:
        raise CorruptEntryError(f"unreadable header: {exc}") from None
    if not isinstance(header, dict):
        raise CorruptEntryError(f"unreadable header: a JSON object is expected, got {type(header).__name__}")
    key = header.pop("key", None)
    if key is not None and not is_store_key(key):
        raise CorruptEntryError(f"header key {key!r} is not a store key")
    codec_id = header.pop("codec", None)
    if version == RAW_VERSION and codec_id is not None:
        raise CorruptEntryError(f"a version {RAW_VERSION} entry names codec {codec_id!r}; it holds raw entries only")
    if version == CODEC_VERSION and not isinstance(codec_id, str):
        raise CorruptEntryError(f"a version {CODEC_VERSION} entry must name its codec, got {codec_id!r}")
    return codec_id or RAW_CODEC_ID, key, header


def peek_codec_id(data: bytes | bytearray | memoryview) -> str | None:
    """The codec id `data`'s header names, read without checking the frame (None: not readable as
    one), to choose which codec decodes it; that decode (`unpack_frame`) still checks everything."""
    view = memoryview(data).cast("B")
    try:
        version, header_len = _check_preamble(view)
        return _parse_header(view[_PREAMBLE.size : _PREAMBLE.size + header_len], version)[0]
    except (CorruptEntryError, StaleEntryError):
        return None


def unpack_frame(data: bytes | bytearray | memoryview) -> Frame:
    """The checked frame in `data`: `CorruptEntryError` (damaged) or `StaleEntryError` (other version)."""
    view = memoryview(data).cast("B")
    version, header_len = _check_frame(view)
    start = _PREAMBLE.size + header_len
    codec_id, key, header = _parse_header(view[_PREAMBLE.size : start], version)
    return Frame(codec_id, key, header, view[start:-DIGEST_BYTES])
