"""Heat-based placement of entries across memory tiers over the byte tiers below them.

Plain bookkeeping around the tiers (`TieredStore` holds the lock and calls in):

* Memory tiers hold an entry in at most one of them; the last byte tier, when there is one, is the
  home of every entry, and the tiers above it cache it.
* A tier makes room by evicting only entries colder than the one coming in (`force` evicts the
  coldest whatever their heat: for an entry that has no other home). Pinned entries are never
  evicted and never promoted (see `pins.py`); when only pinned entries stand in the way of a forced
  entry, the tier goes over its budget (logged, counted in `pin_overshoots`) and `settle` sheds the
  overshoot once they are unpinned.
* An evicted entry is demoted to the next memory tier that takes it, else written to the first byte
  tier that holds or takes it (fastest first), else (memory-only store, read-only or full disk)
  dropped.
"""

from __future__ import annotations

import logging

from .coded_tier import CodedTier
from .entry import KVEntry
from .heat import HeatTracker
from .memory_tier import MemoryTier
from .pins import PinTable
from .stats import StoreCounters

logger = logging.getLogger(__name__)
_WARN_EVERY = 100  # after the first overshoot, warn again every this many


class TierStack:
    """Memory tiers (top, fastest, first) over byte tiers (fastest first). Not thread-safe by itself."""

    def __init__(
        self,
        memory: list[MemoryTier],
        byte_tiers: list[CodedTier],
        heat: HeatTracker,
        counters: StoreCounters,
        pins: PinTable | None = None,
    ):
        self.memory, self.byte_tiers, self.heat, self.counters = memory, byte_tiers, heat, counters
        self.pins = pins if pins is not None else PinTable()

    def find(self, key: str) -> tuple[int, KVEntry] | None:
        """`(level, entry)` of the memory tier holding `key`, or None."""
        for level, tier in enumerate(self.memory):
            entry = tier.get(key)
            if entry is not None:
                return level, entry
        return None

    def remove(self, key: str) -> bool:
        """Drop `key` from every memory tier; True when one held it."""
        return any([tier.pop(key) is not None for tier in self.memory])

    def insert(self, key: str, entry: KVEntry, force: bool) -> bool:
        """A new entry enters the lowest memory tier (and climbs on access)."""
        self.remove(key)
        return bool(self.memory) and self.admit(len(self.memory) - 1, key, entry, force)

    def cache_from_below(self, key: str, entry: KVEntry) -> KVEntry:
        """Hold an entry just read from a byte tier in the highest memory tier that takes it."""
        found = self.find(key)
        if found is not None:  # another thread loaded it meanwhile
            return found[1]
        for level, tier in enumerate(self.memory):
            if self.admit(level, key, entry, force=False):
                return tier.get(key)
        return entry

    def promote(self, level: int, key: str, entry: KVEntry) -> KVEntry:
        """Move `key` from tier `level` to the highest tier above it that takes it (not when pinned)."""
        if level == 0 or self.pins.is_pinned(key):
            return entry
        self.memory[level].pop(key)
        for upper in range(level):
            if self.admit(upper, key, entry, force=False):
                self.counters.promotions += 1
                return self.memory[upper].get(key)
        self.place_from(level, key, entry)  # back where it was: its room is still free
        return entry

    def admit(self, level: int, key: str, entry: KVEntry, force: bool) -> bool:
        """Put `entry` in tier `level`, evicting only colder unpinned entries (any unpinned when `force`)."""
        tier = self.memory[level]
        if key in tier:
            return True
        colder_than = None if force else self.heat.heat(key)
        victims = tier.victims(entry.nbytes, self.heat.heat, colder_than, self.pins.is_pinned)
        over_budget = False
        if victims is None:
            if not (force and self._blocked_by_pins(tier, entry)):
                return False
            victims, over_budget = tier.evictable(self.heat.heat, self.pins.is_pinned), True
        for victim in victims:
            self.place_from(level + 1, victim, tier.pop(victim), demoted=True)
        try:
            tier.put(key, entry, over_budget=over_budget)
        except (RuntimeError, ValueError) as exc:  # e.g. CUDA out of memory
            logger.warning("tier %s could not take entry %s: %s", tier.name, key, exc)
            return False
        if over_budget:
            self._overshot(tier)
        return True

    def _blocked_by_pins(self, tier: MemoryTier, entry: KVEntry) -> bool:
        """Whether `entry` would fit in `tier` were it not for pinned entries."""
        return bool(self.pins) and tier.victims(entry.nbytes, self.heat.heat) is not None

    def _overshot(self, tier: MemoryTier) -> None:
        self.counters.pin_overshoots += 1
        if self.counters.pin_overshoots == 1 or self.counters.pin_overshoots % _WARN_EVERY == 0:
            logger.warning(
                "tier %s is %d bytes over its budget of %d: pinned entries leave no room for an entry with "
                "no other home (%d times so far); the overshoot is shed when they are unpinned",
                tier.name, tier.overshoot_bytes, tier.budget_bytes, self.counters.pin_overshoots,
            )

    def settle(self) -> None:
        """Evict unpinned entries from tiers over their budget (after an unpin) until each fits."""
        for level, tier in enumerate(self.memory):
            for victim in tier.evictable(self.heat.heat, self.pins.is_pinned):
                if tier.overshoot_bytes == 0:
                    break
                self.place_from(level + 1, victim, tier.pop(victim), demoted=True)

    def place_from(self, level: int, key: str, entry: KVEntry, demoted: bool = False) -> None:
        """Give `entry` a home in tier `level` or below; write it to a byte tier if all refuse."""
        for lower in range(level, len(self.memory)):
            if self.admit(lower, key, entry, force=False):
                self.counters.demotions += int(demoted)
                return
        self.counters.evictions += 1
        if not self.byte_tiers:
            logger.debug("memory-only store dropped cold entry %s", key)
        for tier in self.byte_tiers:
            if key in tier or (not tier.read_only and tier.put(key, entry)):
                return
