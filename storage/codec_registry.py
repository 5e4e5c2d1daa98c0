"""Codecs by id, so settings name a codec as data (`StoreOptions(codec="raw")`) and recovery can
read any known codec's files without importing codecs by name.

Example:
    >>> CODECS.get("raw").codec_id
    'raw'
    >>> CODECS.get("zstd-7")
    Traceback (most recent call last):
    ...
    ValueError: unknown codec 'zstd-7'; registered: fp8, int4, int4.2, int8, raw
"""

from __future__ import annotations

import re
import threading

from .codec import EntryCodec, RawCodec
from .quant_codec import QuantCodec

_CODEC_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}\Z")


def check_codec(codec: object) -> EntryCodec:
    """`codec` when it has the `EntryCodec` shape and a valid id; `ValueError` saying what is missing."""
    if not isinstance(codec, EntryCodec):
        raise ValueError(f"a codec needs codec_id, encode(entry, *, key) and decode_keyed(data); got {codec!r}")
    if not isinstance(codec.codec_id, str) or not _CODEC_ID.match(codec.codec_id):
        raise ValueError(f"codec_id must match [a-z0-9][a-z0-9._-]{{0,31}}, got {codec.codec_id!r}")
    return codec


class CodecRegistry:
    """A thread-safe map from codec id to codec object."""

    def __init__(self, *codecs: EntryCodec):
        self._codecs: dict[str, EntryCodec] = {}
        self._lock = threading.Lock()
        for codec in codecs:
            self.register(codec)

    def register(self, codec: EntryCodec) -> EntryCodec:
        """Add `codec`; `ValueError` when another codec already holds its id."""
        check_codec(codec)
        with self._lock:
            held = self._codecs.get(codec.codec_id)
            if held is not None and held is not codec:
                raise ValueError(f"codec id {codec.codec_id!r} is taken by {held!r}; unregister it first")
            self._codecs[codec.codec_id] = codec
        return codec

    def unregister(self, codec_id: str) -> None:
        with self._lock:
            self._codecs.pop(codec_id, None)

    def get(self, codec_id: str) -> EntryCodec:
        """The codec of `codec_id`; `ValueError` naming the registered ids otherwise."""
        with self._lock:
            codec = self._codecs.get(codec_id)
            if codec is None:
                raise ValueError(f"unknown codec {codec_id!r}; registered: {', '.join(sorted(self._codecs))}")
            return codec

    def __contains__(self, codec_id: object) -> bool:
        with self._lock:
            return codec_id in self._codecs

    def ids(self) -> list[str]:
        with self._lock:
            return sorted(self._codecs)


RAW = RawCodec()
CODECS = CodecRegistry(RAW, *(QuantCodec(scheme) for scheme in ("int8", "fp8", "int4", "int4.2")))
