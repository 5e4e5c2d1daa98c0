"""`QuantCodec`: entries stored quantized (int8, fp8 or int4 with scales; see `quantize.py`).

Unlike `raw`, a quantized codec changes the numbers, so the store applies it when an entry is put
(`compress`): every tier then holds the packed entry, and the bytes on disk are that entry's
tensors and scales as they are, inside the checked frame (the checksum covers the packed bytes).
The header lists every tensor's dtype and shape; reading checks them against the scheme, so a
frame that passes the checksum but does not describe a packed entry is still refused as corrupt.
A scheme's settings are fixed by its id: changing one needs a new id, which gives new entry keys.

Example:
    >>> import torch
    >>> from fusionrag_llm.storage.entry import KVEntry
    >>> codec = QuantCodec("int4")
    >>> kv = torch.randn(2, 1, 3, 8, generator=torch.Generator().manual_seed(0))
    >>> packed = codec.compress(KVEntry((1, 2, 3), kv, kv.clone()))
    >>> codec.decode_keyed(codec.encode(packed, key="ab" * 32))[1].bitwise_equal(packed)
    True
"""

from __future__ import annotations

import sys

import torch

from .codec import DTYPES, dtype_name, entry_from_header, expect_codec, payload_tensors, tensor_bytes
from .entry import KVEntry
from .frame import CorruptEntryError, pack_frame, unpack_frame
from .quantize import SCHEMES, check_packed, pack, scheme_of

_TENSORS = ("keys", "values")


class QuantCodec:
    """The codec of one quantization scheme (`"int8"`, `"fp8"` or `"int4"`); its id is the scheme's."""

    def __init__(self, scheme: str):
        if scheme not in SCHEMES:
            raise ValueError(f"unknown quantization scheme {scheme!r}; allowed: {', '.join(SCHEMES)}")
        self.scheme = SCHEMES[scheme]
        self.codec_id = scheme

    def __repr__(self) -> str:
        return f"QuantCodec({self.codec_id!r})"

    def compress(self, entry: KVEntry) -> KVEntry:
        """`entry` packed by this scheme (an entry it already packed is returned as it is)."""
        found = scheme_of(entry, prefer=self.scheme)
        if found is None:
            return pack(entry, self.scheme)
        if found != self.scheme:
            raise ValueError(f"entry is packed as {found.name}; codec {self.codec_id!r} cannot store it")
        return entry

    def encode(self, entry: KVEntry, *, key: str | None = None) -> bytes:
        packed = self.compress(entry)
        names = [*_TENSORS, *self.scheme.extra_names]
        tensors = [packed.keys, packed.values, *(packed.extras[n] for n in self.scheme.extra_names)]
        header = {
            "tensors": [[n, dtype_name(t.dtype), list(t.shape)] for n, t in zip(names, tensors)],
            "byteorder": sys.byteorder,
            "token_ids": list(packed.token_ids),
            "meta": packed.meta,
        }
        return pack_frame(self.codec_id, header, [tensor_bytes(t) for t in tensors], key=key)

    def decode_keyed(self, data: bytes | bytearray | memoryview) -> tuple[str | None, KVEntry]:
        """`(key written in the header or None, packed entry)`; `CorruptEntryError` for bytes that
        are damaged or do not describe an entry of this scheme."""
        frame = unpack_frame(data)
        expect_codec(frame, self.codec_id)
        tensors = payload_tensors(frame, _parse_specs(frame.header, [*_TENSORS, *self.scheme.extra_names]))
        extras = dict(zip(self.scheme.extra_names, tensors[2:]))
        entry = entry_from_header(frame.header, tensors[0], tensors[1], extras)
        try:
            check_packed(entry, self.scheme)
        except ValueError as exc:
            raise CorruptEntryError(f"header does not describe a {self.codec_id} entry: {exc}") from None
        return frame.key, entry


def _parse_specs(header: dict, names: list[str]) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    """`(dtype, shape)` of each tensor the header lists, in the order `names` gives."""
    try:
        listed = header["tensors"]
        if [item[0] for item in listed] != names:
            raise ValueError(f"tensors {[item[0] for item in listed]}, expected {names}")
        return [(DTYPES[dtype], tuple(int(d) for d in shape)) for _, dtype, shape in listed]
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise CorruptEntryError(f"unreadable header: {exc!r}") from None
