"""Pins: reference counts on keys whose entries a running request reads without a copy.

`TieredStore.get(..., copy=False)` hands out a memory tier's own tensors. While a request reads
them, the tier must neither evict nor move the entry: its bytes would leave the tier's accounting
while still in use, and a tier that reuses freed memory would overwrite them. A pinned key is never
an eviction victim and is not promoted; if only pinned entries stand in the way of an entry with no
other home, the tier goes over its budget for a while (logged, counted) and sheds the overshoot as
soon as keys are unpinned. Plain Python; the store's lock guards it.

Example:
    >>> pins = PinTable()
    >>> pins.pin("a"), pins.pin("a"), pins.unpin("a"), "a" in pins
    (1, 2, 1, True)
    >>> pins.unpin("a"), "a" in pins
    (0, False)
"""

from __future__ import annotations


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

    def keys(self) -> list[str]:
        return list(self._counts)

    def pin(self, key: str) -> int:
        """Add one holder of `key`; return how many hold it now."""
        self._counts[key] = self._counts.get(key, 0) + 1
        return self._counts[key]

    def unpin(self, key: str) -> int:
        """Drop one holder of `key`; return how many hold it now. `ValueError` when none did."""
        count = self._counts.get(key, 0)
        if count == 0:
            raise ValueError(f"key {key!r} is not pinned: unpin must follow a pin of the same key")
        if count == 1:
            del self._counts[key]
        else:
            self._counts[key] = count - 1
        return count - 1
