"""Pins: reference counts on keys whose entries a running request reads without a copy.

`TieredStore.get(..., copy=False)` hands out a memory tier's own tensors. While a request reads
them, the tier must neither evict nor move the entry: its bytes would leave the tier's accounting
while still in use, and a tier that reuses freed memory would overwrite them. A pinned key is never
an eviction victim and is not promoted; if only pinned entries stand in the way of an entry with no
other home, the tier goes over its budget for a while (logged, counted) and sheds the overshoot as
soon as keys are unpinned. `PinTable` is plain Python guarded by the store's lock; `PinningMixin`
is how callers pin: per key (`get(..., pin=True)` or `pin`, then `unpin`) or for a block
(`with store.pinned(keys) as entries:`).

Example:
    >>> pins = PinTable()
    >>> pins.pin("a"), pins.pin("a"), pins.unpin("a"), "a" in pins
    (1, 2, 1, True)
    >>> pins.unpin("a"), "a" in pins
    (0, False)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from .entry import KVEntry
from .keys import check_key


class PinTable:
    """How many holders pinned each key; a key is pinned while its count is above zero."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._counts

    def __len__(self) -> int:
        return len(self._counts)

    def is_pinned(self, key: str) -> bool:
        return key in self._counts

    def count(self, key: str) -> int:
        return self._counts.get(key, 0)

    def pin(self, key: str) -> int:
        """Add one holder of `key`; return how many hold it now."""
        self._counts[key] = self._counts.get(key, 0) + 1
        return self._counts[key]

    def unpin(self, key: str) -> int:
        """Drop one holder of `key`; return how many hold it now. `ValueError` when none did."""
        count = self._counts.pop(key, 0)
        if count == 0:
            raise ValueError(f"key {key!r} is not pinned: unpin must follow a pin of the same key")
        if count > 1:
            self._counts[key] = count - 1
        return count - 1


class PinningMixin:
    """`pin`, `unpin`, `pin_count` and `pinned` of `TieredStore`, over its `_lock`, `_pins` and `_stack`."""

    def pin(self, key: str) -> int:
        """Pin `key` (one more holder): its memory copy is neither evicted nor moved until unpinned.
        Returns the number of holders. A key not in memory yet stays once loaded."""
        check_key(key)
        with self._lock:
            return self._pins.pin(key)

    def unpin(self, key: str) -> int:
        """Drop one holder of `key`; returns how many remain. `ValueError` when it was not pinned.
        The last unpin lets tiers that went over budget for pinned entries shed the overshoot."""
        check_key(key)
        with self._lock:
            left = self._pins.unpin(key)
            if left == 0 and not self._closed:
                self._stack.settle()
            return left

    def pin_count(self, key: str) -> int:
        """How many holders pinned `key` (0: not pinned)."""
        with self._lock:
            return self._pins.count(key)

    @contextmanager
    def pinned(
        self, keys: Iterable[str], expect_token_ids: Mapping[str, Iterable[int]] | None = None
    ) -> Iterator[dict[str, KVEntry]]:
        """`{key: entry}` of the keys found (tiers' own tensors, no copy: read-only), pinned until
        the block ends. Keys missing (or whose token ids differ from `expect_token_ids[key]`) are absent.

            with store.pinned(keys) as entries:
                ...  # eviction cannot drop or move entries[k] meanwhile
        """
        expected = dict(expect_token_ids or {})
        entries: dict[str, KVEntry] = {}
        try:
            for key in dict.fromkeys(keys):
                found = self.get(key, expected.get(key), copy=False, pin=True)
                if found is not None:
                    entries[key] = found[0]
            yield entries
        finally:
            for key in entries:
                self.unpin(key)
