"""The pin API of `TieredStore`: holders of entries handed out without a copy keep them in place.

See `pins.py` for what a pin guarantees. The store's lock, pin table and tier stack do the work;
this mixin only says how callers pin: per key (`get(..., pin=True)` or `pin`, then `unpin`) or for
a block (`with store.pinned(keys) as entries:`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from .entry import KVEntry
from .keys import check_key


class PinningMixin:
    """`pin`, `unpin`, `pin_count` and `pinned` over `self._lock`, `self._pins` and `self._stack`."""

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
