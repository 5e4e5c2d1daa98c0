"""`CodedTier`: a `ByteTier` seen through a codec, so the store puts and gets entries.

Every value read is checked before it is used: a corrupt one (damaged frame or payload) is logged,
counted, discarded from the byte tier and reported as a miss; a stale one (another format version
or another codec's bytes) is logged and counted, and left for `verify(repair=True)`; a valid entry
filed under another key (rows or files swapped) is a miss, logged and counted in `key_mismatches`.
"""

from __future__ import annotations

import logging
import threading

from .byte_tier import ByteTier, Problem
from .codec import EntryCodec
from .codec_registry import CODECS, RAW, check_codec
from .entry import KVEntry
from .frame import CorruptEntryError, StaleEntryError, peek_codec_id
from .keys import check_key
from .stats import VerifyReport

logger = logging.getLogger(__name__)


class CodedTier:
    """Entries stored as `codec` bytes in `byte_tier`.

    Example:
        >>> import tempfile, torch
        >>> from fusionrag_llm.storage.disk import DiskBytes
        >>> tier = CodedTier(DiskBytes(tempfile.mkdtemp(), budget_bytes=2**20))
        >>> e = KVEntry((1,), torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4))
        >>> tier.put("ab" * 32, e), tier.get("ab" * 32).bitwise_equal(e), tier.codec_id
        (True, True, 'raw')
        >>> tier.close()
    """

    def __init__(self, byte_tier: ByteTier, codec: EntryCodec = RAW):
        if not isinstance(byte_tier, ByteTier):
            raise ValueError(f"byte_tier must have the ByteTier shape (get/put/delete/discard/...), got {byte_tier!r}")
        self.bytes = byte_tier
        self.codec = check_codec(codec)
        self._where = str(getattr(byte_tier, "where", byte_tier.name))  # for logs
        self.stale_count = self.key_mismatches = self._corrupt = 0
        self._counter_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.bytes!r}, codec={self.codec.codec_id!r})"

    def __getattr__(self, name: str):
        """The byte tier's own attributes: `name`, `read_only`, `budget_bytes`, `used_bytes`,
        `evictions`, `write_failures`, `keys()`, `stats()`, `clear()`, `close()`."""
        if name == "bytes":  # not set yet (a failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self.bytes, name)

    @property
    def shared(self) -> bool:
        """Whether the byte tier is shared by processes (a remote cache): every put writes through."""
        return bool(getattr(self.bytes, "shared", False))

    @property
    def codec_id(self) -> str:
        return self.codec.codec_id

    @property
    def corrupt_count(self) -> int:
        """Corrupt values found by decoding here plus those the byte tier refused to read."""
        return self._corrupt + self.bytes.corrupt_count

    def __contains__(self, key: object) -> bool:
        return key in self.bytes

    def __len__(self) -> int:
        return len(self.bytes)

    def _count(self, name: str) -> None:
        with self._counter_lock:
            setattr(self, name, getattr(self, name) + 1)

    # ----------------------------------------------------------------------------- entries
    def encode(self, key: str, entry: KVEntry) -> bytes:
        return self.codec.encode(entry, key=key)

    def put(self, key: str, entry: KVEntry, *, persist: bool = False) -> bool:
        """Encode `entry` bound to `key` and store it; see `ByteTier.put` for False and `persist`."""
        check_key(key)
        if self.read_only:  # let the byte tier say why, without paying for an encoding
            return self.bytes.put(key, b"", persist=persist)
        return self.bytes.put(key, self.encode(key, entry), persist=persist)

    def put_bytes(self, key: str, data: bytes, *, persist: bool = False) -> bool:
        """Store bytes this codec wrote for `key` (read from another tier with the same codec)."""
        check_key(key)
        return self.bytes.put(key, data, persist=persist)

    def get(self, key: str) -> KVEntry | None:
        """The entry stored under `key`, or None when absent, corrupt (then discarded), stale or
        bound to another key (all logged)."""
        found = self.fetch(key)
        return None if found is None else found[0]

    def fetch(self, key: str) -> tuple[KVEntry, bytes] | None:
        """`(entry, its checked bytes)` stored under `key`, or None as for `get`."""
        check_key(key)
        data = self.bytes.get(key)
        if data is None:
            return None
        try:
            stored_key, entry = self.codec.decode_keyed(data)
        except StaleEntryError as exc:
            self._count("stale_count")
            logger.warning("%s tier: entry %s in %s is stale (%s); treated as a miss", self.name, key, self._where, exc)
            return None
        except CorruptEntryError as exc:
            self._drop_corrupt(key, data, exc)
            return None
        if stored_key != key:
            self._count("key_mismatches")
            logger.warning("%s tier: entry %s in %s holds the entry of key %s; treated as a miss",
                           self.name, key, self._where, stored_key)  # fmt: skip
            return None
        return entry, data

    def _drop_corrupt(self, key: str, data: bytes, exc: CorruptEntryError) -> None:
        self._count("_corrupt")
        action = "skipped (read-only store)" if self.read_only else "deleting it"
        logger.warning("%s tier: entry %s in %s is corrupt (%s); %s", self.name, key, self._where, exc, action)
        if not self.read_only:
            self.bytes.discard(key, data)

    def classify(self, key: str, data: bytes) -> Problem | None:
        """What is wrong with `data` stored under `key` (`verify`'s report field, detail), or None.

        An entry another registered codec wrote (a store folder may hold entries of several codecs,
        each under keys of its own) is checked with that codec, so `verify` never takes a valid
        entry for a stale one; stale means a format or codec this reader does not know."""
        try:
            stored_key, _ = self._writer_of(data).decode_keyed(data)
        except StaleEntryError as exc:
            return "stale", str(exc)
        except CorruptEntryError as exc:
            return "corrupt", str(exc)
        if stored_key != key:
            return "mismatched", f"holds the entry of key {stored_key}"
        return None

    def _writer_of(self, data: bytes) -> EntryCodec:
        """The registered codec `data`'s header names (this tier's when it names none known), read
        from the header alone: the decode that follows checks the frame, once."""
        codec_id = peek_codec_id(data)
        return CODECS.get(codec_id) if codec_id not in (None, self.codec.codec_id) and codec_id in CODECS else self.codec

    def delete(self, key: str) -> bool:
        check_key(key)
        return self.bytes.delete(key)

    def verify(self, repair: bool = False) -> VerifyReport:
        """Check every value with this tier's codec; see the byte tier's `verify` for what is removed."""
        return self.bytes.verify(self.classify, repair)
