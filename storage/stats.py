"""Counters and reports of the tiered store (plain Python): occupancy, access counters, `verify`'s findings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class TierStats:
    """Occupancy of one tier at the time `TieredStore.stats()` was called."""

    name: str
    entries: int
    bytes: int
    budget_bytes: int


@dataclass
class StoreStats:
    """Snapshot of a store: per-tier occupancy and this process's access counters.

    `hits[tier]` counts `get` calls answered from that tier (where the entry was found, before any
    promotion); `misses` counts the rest, including token-id mismatches, corrupt entries (values a
    shared tier refused for their MAC included), entries bound to another key (`key_mismatches`) and
    entries of another codec version (`stale`). `evictions` counts entries that left the memory
    tiers; `disk_evictions` entries this process deleted from disk to stay within the disk budget;
    `disk_write_failures` writes to disk that failed (full disk, lock timeout...); `read_only`
    whether the disk tier takes no writes. With several byte tiers, `corrupt`, `stale`,
    `key_mismatches`, `disk_evictions` and `disk_write_failures` add up all of them. `pinned` counts
    keys pinned now; `pin_overshoots` how often a memory tier went over its budget because only
    pinned entries stood in the way.
    """

    tiers: dict[str, TierStats]
    hits: dict[str, int]
    misses: int = 0
    corrupt: int = 0
    token_mismatches: int = 0
    promotions: int = 0
    demotions: int = 0
    evictions: int = 0
    disk_evictions: int = 0
    key_mismatches: int = 0
    stale: int = 0
    disk_write_failures: int = 0
    read_only: bool = False
    pinned: int = 0
    pin_overshoots: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class StoreCounters:
    """Mutable access counters kept by the store."""

    hits: dict[str, int] = field(default_factory=dict)
    misses: int = 0
    token_mismatches: int = 0
    promotions: int = 0
    demotions: int = 0
    evictions: int = 0
    pin_overshoots: int = 0

    def hit(self, tier: str) -> None:
        self.hits[tier] = self.hits.get(tier, 0) + 1


@dataclass
class VerifyReport:
    """What `verify` found. Keys for entry problems, rowids for foreign rows, relative paths for files.

    * `corrupt`: damaged values, or values the store refuses to read (a link, a FIFO, a text row);
    * `stale`: bytes of another format version or codec (recomputed on the next miss anyway);
    * `mismatched`: a valid entry filed under another key than the one in its bytes;
    * `missing_files`: rows whose file is gone or unreadable;
    * `foreign_rows`: rows not in the store's form (e.g. a key that is not 64 lowercase hex chars);
    * `orphan_files`: files no row names, e.g. left by a writer killed before its row was committed.

    Corrupt entries are removed in any case unless the store is `read_only`; the rest only when
    `repaired` (`repair=True` on a writable store).
    """

    checked: int = 0
    corrupt: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    missing_files: list[str] = field(default_factory=list)
    foreign_rows: list[int] = field(default_factory=list)
    orphan_files: list[str] = field(default_factory=list)
    repaired: bool = False
    read_only: bool = False

    _LISTS = ("corrupt", "stale", "mismatched", "missing_files", "foreign_rows", "orphan_files")

    @property
    def problems(self) -> int:
        return sum(len(getattr(self, name)) for name in self._LISTS)

    @property
    def ok(self) -> bool:
        return self.problems == 0

    def merge(self, other: VerifyReport) -> VerifyReport:
        """One report for two tiers: counts and lists added, `repaired` only when both were."""
        merged = VerifyReport(self.checked + other.checked, repaired=self.repaired and other.repaired,
                              read_only=self.read_only or other.read_only)  # fmt: skip
        for name in self._LISTS:
            setattr(merged, name, getattr(self, name) + getattr(other, name))
        return merged
