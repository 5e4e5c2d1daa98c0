"""The tier list of a `TieredStore`: built from budgets and options, or checked when given; the
heat-based placement of entries across it (`TierStack`); its stats and `verify` over the list.

A store's tiers are one list, fastest first: memory tiers (`MemoryTier`, decoded entries on a
device or in host memory), then byte tiers (`CodedTier`: encoded entries, e.g. the disk). The last
byte tier is the home of every entry. All byte tiers share one codec, so bytes move between them
as they are and the store has one `codec_id`.

A shared byte tier (a remote cache several processes use, `RedisBytes`) is the exception to "the
last byte tier is the home": the home is then the last local one, and every put writes through to
the shared tiers too, so what one process computes, the others load. Others can write a shared tier,
so it is always seen through `AuthenticatedBytes` (values tagged with a keyed MAC, unless the
settings declare the network trusted): a store refuses a shared byte tier without it.

Placement (`TierStack`) is plain bookkeeping (`TieredStore` holds the lock and calls in):

* Memory tiers hold an entry in at most one of them; the tiers above the home cache it.
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
from collections.abc import Sequence
from dataclasses import asdict
from functools import reduce
from pathlib import Path

import torch

from .codec_registry import CODECS
from .coded_tier import CodedTier
from .disk import DiskTier
from .entry import KVEntry
from .heat import HeatTracker
from .mac_bytes import AuthenticatedBytes, check_secret, secret_id
from .memory_tier import DeviceTier, HostTier, MemoryTier
from .pins import PinTable
from .settings import StoreBudgets, StoreOptions
from .stats import StoreCounters, StoreStats, TierStats, VerifyReport

logger = logging.getLogger(__name__)
_WARN_EVERY = 100  # after the first overshoot, warn again every this many

Tier = MemoryTier | CodedTier


def default_tiers(
    directory: str | Path | None, budgets: StoreBudgets, device: torch.device | str | None, options: StoreOptions
) -> list[Tier]:
    """[device tier (on an accelerator)], [host tier], [disk tier (with a directory)] from settings."""
    codec = CODECS.get(options.codec)  # before any folder is opened: an unknown id opens nothing
    tiers: list[Tier] = []
    if device is not None and torch.device(device).type != "cpu" and budgets.device_bytes > 0:
        tiers.append(DeviceTier(budgets.device_bytes, device))
    if budgets.host_bytes > 0:  # pinned beside a GPU: its reads are asynchronous copies (layer-wise loading)
        beside_gpu = device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available()
        tiers.append(HostTier(budgets.host_bytes, pin=beside_gpu))
    if directory is not None:
        if budgets.disk_bytes <= 0:
            raise ValueError("StoreBudgets.disk_bytes must be > 0 when a directory is given")
        disk = DiskTier(
            directory,
            budgets.disk_bytes,
            codec=codec,
            min_file_bytes=options.disk_min_file_bytes,
            timeout_s=options.disk_timeout_s,
            read_only=options.read_only,
            heat_half_life_s=options.shared_heat_half_life_s,
        )
        tiers.append(disk)
    if options.remote_url is not None and budgets.remote_bytes > 0:
        tiers.append(remote_tier(options, budgets.remote_bytes, codec))
    return tiers


def remote_tier(options: StoreOptions, budget_bytes: int, codec) -> CodedTier:
    """The shared remote tier `options.remote_url` names, its values tagged with `options.remote_secret`
    (none on a trusted network: `StoreOptions` has checked that one of the two is set), under the keys
    of `remote_key_prefix`. The redis client is imported here only."""
    from .redis_bytes import RedisBytes

    prefix = remote_key_prefix(options.remote_prefix, options.remote_secret)
    remote = RedisBytes(options.remote_url, budget_bytes, prefix=prefix, timeout_s=options.remote_timeout_s,
                        retry_s=options.remote_retry_s, read_only=options.read_only,
                        heat_half_life_s=options.shared_heat_half_life_s)  # fmt: skip
    return CodedTier(AuthenticatedBytes(remote, options.remote_secret), codec)


def remote_key_prefix(prefix: str, secret: str | None) -> str:
    """The prefix of every key a remote tier uses: `prefix`, followed with a secret by the secret's id
    (`mac_bytes.secret_id`, which tells nothing of the secret). Engines with different secrets then
    keep apart on one server: each its own values, budget and heat, never writing over the other's
    (they could not read them anyway); a trusted network keeps `prefix` itself.

    >>> remote_key_prefix("fusionrag:kv:", None)
    'fusionrag:kv:'
    >>> remote_key_prefix("fusionrag:kv:", "s" * 16) == remote_key_prefix("fusionrag:kv:", "t" * 16)
    False
    """
    if secret is None:
        return prefix
    return f"{prefix}{secret_id(check_secret(secret).encode('utf-8')).hex()}:"


def home_tier(byte_tiers: Sequence[CodedTier]) -> CodedTier | None:
    """The byte tier every put writes to: the last local one, else the last one (None: memory only)."""
    local = [t for t in byte_tiers if not t.shared]
    return (local or list(byte_tiers) or [None])[-1]


def split_tiers(tiers: Sequence[Tier]) -> tuple[list[MemoryTier], list[CodedTier]]:
    """`(memory tiers, byte tiers)` of a list, fastest first; `ValueError` saying what is wrong."""
    tiers = list(tiers)
    if not tiers:
        raise ValueError("a store needs a directory (disk tier) or host_bytes > 0 (memory tier)")
    for tier in tiers:
        if not isinstance(tier, (MemoryTier, CodedTier)):
            raise ValueError(f"a tier must be a MemoryTier or a CodedTier (a codec over a ByteTier), got {tier!r}")
    memory = [t for t in tiers if isinstance(t, MemoryTier)]
    coded = [t for t in tiers if isinstance(t, CodedTier)]
    for tier in coded:
        if tier.shared and not isinstance(tier.bytes, AuthenticatedBytes):
            raise ValueError(f"the shared byte tier {tier.name!r} must authenticate its values: use "
                             "CodedTier(AuthenticatedBytes(tier, secret), codec) (secret=None only on a trusted network)")  # fmt: skip
    if tiers != memory + coded:
        raise ValueError(f"memory tiers must come before byte tiers (fastest first), got {[t.name for t in tiers]}")
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise ValueError(f"tier names must be unique, got {names}")
    codecs = sorted({t.codec_id for t in coded})
    if len(codecs) > 1:
        raise ValueError(f"byte tiers of one store must share a codec, got {codecs}")
    return memory, coded


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
            )  # fmt: skip

    def settle(self) -> None:
        """Evict unpinned entries from tiers over their budget (after an unpin) until each fits."""
        for level, tier in enumerate(self.memory):
            if tier.overshoot_bytes == 0:  # the usual case: no ordering of the tier's keys to make
                continue
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


def memory_stats(memory: list[MemoryTier], counters: StoreCounters, pinned: int) -> StoreStats:
    """Stats of the memory tiers and the store's counters (taken under the store's lock)."""
    tiers = {t.name: TierStats(t.name, len(t), t.used_bytes, t.budget_bytes) for t in memory}
    return StoreStats(tiers, pinned=pinned, **asdict(counters))


def add_byte_tier_stats(stats: StoreStats, byte_tiers: list[CodedTier]) -> StoreStats:
    """Add each byte tier's occupancy and counters (I/O: taken outside the store's lock)."""
    for tier in byte_tiers:
        stats.tiers[tier.name] = tier.stats()
        stats.corrupt += tier.corrupt_count
        stats.stale += tier.stale_count
        stats.key_mismatches += tier.key_mismatches
        stats.disk_evictions += tier.evictions
        stats.disk_write_failures += tier.write_failures
    home = home_tier(byte_tiers)
    stats.read_only = home is not None and home.read_only
    return stats


def verify_tiers(byte_tiers: list[CodedTier], repair: bool) -> VerifyReport:
    """Every byte tier's `verify`, as one report."""
    reports = [tier.verify(repair) for tier in byte_tiers]
    return reduce(VerifyReport.merge, reports) if reports else VerifyReport()
