"""Heat-based placement of entries across memory tiers over an optional disk tier.

Plain bookkeeping around the tiers (`TieredStore` holds the lock and calls in):

* Memory tiers hold an entry in at most one of them; the disk tier, when present, is the home of
  every entry and memory tiers cache it.
* A tier makes room by evicting only entries colder than the one coming in (`force` evicts the
  coldest whatever their heat: for an entry that has no other home).
* An evicted entry is demoted to the next memory tier that takes it, else written back to disk when
  disk lacks it, else (memory-only store, read-only or full disk) dropped.
"""

from __future__ import annotations

import logging

from .disk_tier import DiskTier
from .entry import KVEntry
from .heat import HeatTracker
from .memory_tier import MemoryTier
from .stats import StoreCounters

logger = logging.getLogger(__name__)


class TierStack:
    """Memory tiers (top, fastest, first) over an optional disk tier. Not thread-safe by itself."""

    def __init__(self, memory: list[MemoryTier], disk: DiskTier | None, heat: HeatTracker, counters: StoreCounters):
        self.memory, self.disk, self.heat, self.counters = memory, disk, heat, counters

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

    def cache_from_disk(self, key: str, entry: KVEntry) -> KVEntry:
        """Hold an entry just read from disk in the highest memory tier that takes it."""
        found = self.find(key)
        if found is not None:  # another thread loaded it meanwhile
            return found[1]
        for level, tier in enumerate(self.memory):
            if self.admit(level, key, entry, force=False):
                return tier.get(key)
        return entry

    def promote(self, level: int, key: str, entry: KVEntry) -> KVEntry:
        """Move `key` from tier `level` to the highest tier above it that takes it."""
        if level == 0:
            return entry
        self.memory[level].pop(key)
        for upper in range(level):
            if self.admit(upper, key, entry, force=False):
                self.counters.promotions += 1
                return self.memory[upper].get(key)
        self.place_from(level, key, entry)  # back where it was: its room is still free
        return entry

    def admit(self, level: int, key: str, entry: KVEntry, force: bool) -> bool:
        """Put `entry` in tier `level`, evicting only colder entries (any entries when `force`)."""
        tier = self.memory[level]
        if key in tier:
            return True
        colder_than = None if force else self.heat.heat(key)
        victims = tier.victims(entry.nbytes, self.heat.heat, colder_than)
        if victims is None:
            return False
        for victim in victims:
            self.place_from(level + 1, victim, tier.pop(victim), demoted=True)
        try:
            tier.put(key, entry)
        except (RuntimeError, ValueError) as exc:  # e.g. CUDA out of memory
            logger.warning("tier %s could not take entry %s: %s", tier.name, key, exc)
            return False
        return True

    def place_from(self, level: int, key: str, entry: KVEntry, demoted: bool = False) -> None:
        """Give `entry` a home in tier `level` or below; write it back to disk if all refuse."""
        for lower in range(level, len(self.memory)):
            if self.admit(lower, key, entry, force=False):
                self.counters.demotions += int(demoted)
                return
        self.counters.evictions += 1
        if self.disk is not None and key not in self.disk:
            self.disk.put(key, entry)
        elif self.disk is None:
            logger.debug("memory-only store dropped cold entry %s", key)
