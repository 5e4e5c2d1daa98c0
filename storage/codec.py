"""Codecs turn a `KVEntry` into framed, checksummed bytes and back; `raw` is the default one.

A codec is any object with the `EntryCodec` shape: a `codec_id` and `encode`/`decode_keyed`. It
builds its bytes with `frame.pack_frame` and reads them with `frame.unpack_frame`, so magic,
version, lengths, the checksum and the key binding are checked the same way for every codec (see
`frame.py`). Tiers hold one codec object each; `codec_registry.CODECS` maps ids to codecs for
settings given as data (`StoreOptions.codec`) and for recovery.

`raw` stores keys and values as raw bytes in the entry's dtype (the store has cast it to its
storage dtype already, `TieredStore.stored_form`; bf16 and fp16 bits are kept exactly; bytes are
taken through a uint8 view since numpy has no bfloat16). Its header holds dtype, shape, byte order,
token ids and meta; its bytes are those of format version 2, unchanged. It stores no extras: an
entry with extras needs the codec that made them.

Example:
    >>> import torch
    >>> from fusionrag_llm.storage.entry import KVEntry
    >>> e = KVEntry((1, 2), torch.ones(1, 1, 2, 4, dtype=torch.bfloat16), torch.zeros(1, 1, 2, 4, dtype=torch.bfloat16))
    >>> key, entry = RawCodec().decode_keyed(RawCodec().encode(e, key="ab" * 32))
    >>> key == "ab" * 32, entry.bitwise_equal(e)
    (True, True)
"""

from __future__ import annotations

import math
import sys
from typing import Protocol, runtime_checkable

import torch

from .entry import KVEntry
from .frame import RAW_CODEC_ID, CorruptEntryError, Frame, StaleEntryError, pack_frame, unpack_frame

_DTYPE_NAMES = (
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8",
)
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in _DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)
}
__all__ = ["CorruptEntryError", "EntryCodec", "RawCodec", "StaleEntryError"]


@runtime_checkable
class EntryCodec(Protocol):
    """What a tier needs to store entries as bytes.

    `encode` must bind the bytes to `key` (through `pack_frame`); `decode_keyed` returns the key
    written in them and raises `CorruptEntryError` for damaged bytes and `StaleEntryError` for bytes
    it does not read (another version, or another codec's: see `expect_codec`).
    """

    codec_id: str

    def encode(self, entry: KVEntry, *, key: str | None = None) -> bytes: ...

    def decode_keyed(self, data: bytes | bytearray | memoryview) -> tuple[str | None, KVEntry]: ...


def expect_codec(frame: Frame, codec_id: str) -> None:
    """`StaleEntryError` unless `frame` was written by `codec_id`: another codec's bytes are never misread."""
    if frame.codec_id != codec_id:
        raise StaleEntryError(f"entry was written by codec {frame.codec_id!r}, this reader is codec {codec_id!r}")


def dtype_name(dtype: torch.dtype) -> str:
    """The codec's name of a storage dtype; `ValueError` for dtypes it cannot store."""
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"storage dtype {dtype} is not supported; allowed: {', '.join(DTYPES)}")


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of `tensor` through a uint8 view of a contiguous CPU copy (every dtype, bf16 included)."""
    return memoryview(tensor.detach().cpu().contiguous().view(torch.uint8).numpy()).cast("B")


def entry_from_header(header: dict, keys: torch.Tensor, values: torch.Tensor, extras: dict | None = None) -> KVEntry:
    """The entry a decoded header and tensors describe; `CorruptEntryError` when they do not fit."""
    try:
        return KVEntry(tuple(header["token_ids"]), keys, values, header.get("meta", {}), extras or {})
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptEntryError(f"header does not describe a valid entry: {exc}") from None


class RawCodec:
    """Keys and values as raw bytes in the entry's own dtype."""

    codec_id = RAW_CODEC_ID

    def __repr__(self) -> str:
        return "RawCodec()"

    def encode(self, entry: KVEntry, *, key: str | None = None) -> bytes:
        if entry.extras:
            raise ValueError(
                f"the raw codec stores keys and values only; this entry has extras ({', '.join(entry.extras)}): "
                "store it with the codec that made them"
            )
        header = {
            "dtype": dtype_name(entry.dtype),
            "shape": list(entry.keys.shape),
            "byteorder": sys.byteorder,
            "token_ids": list(entry.token_ids),
            "meta": entry.meta,
        }
        payload = [tensor_bytes(entry.keys), tensor_bytes(entry.values)]
        return pack_frame(self.codec_id, header, payload, key=key)

    def decode_keyed(self, data: bytes | bytearray | memoryview) -> tuple[str | None, KVEntry]:
        """`(key written in the header or None, entry)` with CPU tensors.

        Raises `CorruptEntryError` on bad magic, truncation or checksum mismatch, and its subclass
        `StaleEntryError` for bytes of another format version or codec.
        """
        frame = unpack_frame(data)
        expect_codec(frame, self.codec_id)
        try:
            spec = (DTYPES[frame.header["dtype"]], tuple(int(d) for d in frame.header["shape"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntryError(f"unreadable header: {exc!r}") from None
        keys, values = payload_tensors(frame, [spec, spec])
        return frame.key, entry_from_header(frame.header, keys, values)


def payload_tensors(frame: Frame, specs: list[tuple[torch.dtype, tuple[int, ...]]]) -> list[torch.Tensor]:
    """The tensors of `frame`'s payload, laid out back to back as `specs` (dtype, 4-D shape) say;
    `CorruptEntryError` when the header's byte order, the shapes or the payload's length do not fit."""
    byteorder = frame.header.get("byteorder")
    if byteorder != sys.byteorder:
        raise CorruptEntryError(f"entry was written {byteorder}-endian, this machine is {sys.byteorder}")
    if any(len(shape) != 4 or min(shape) < 1 for _, shape in specs):
        raise CorruptEntryError(f"bad tensor shapes {[shape for _, shape in specs]} in header")
    sizes = [math.prod(shape) * torch.empty((), dtype=dtype).element_size() for dtype, shape in specs]
    if sum(sizes) != len(frame.payload):
        raise CorruptEntryError(f"entry length does not match header: payload of {len(frame.payload)} bytes "
                                f"for tensors of {sum(sizes)} bytes")  # fmt: skip
    buffer, offset, tensors = bytearray(frame.payload), 0, []  # one copy, owned by the tensors
    for (dtype, shape), size in zip(specs, sizes):
        tensors.append(torch.frombuffer(buffer, dtype=torch.uint8, count=size, offset=offset).view(dtype).view(shape))
        offset += size
    return tensors

