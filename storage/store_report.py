"""`TieredStore.stats` and `verify` over a tier list: per-tier occupancy, counters added up."""

from __future__ import annotations

from .coded_tier import CodedTier
from .memory_tier import MemoryTier
from .stats import StoreCounters, StoreStats, TierStats, VerifyReport
from .tier_list import home_tier


def memory_stats(memory: list[MemoryTier], counters: StoreCounters, pinned: int) -> StoreStats:
    """Stats of the memory tiers and the store's counters (taken under the store's lock)."""
    tiers = {t.name: TierStats(t.name, len(t), t.used_bytes, t.budget_bytes) for t in memory}
    c = counters
    return StoreStats(
        tiers, dict(c.hits), c.misses, token_mismatches=c.token_mismatches, promotions=c.promotions,
        demotions=c.demotions, evictions=c.evictions, pinned=pinned, pin_overshoots=c.pin_overshoots,
    )  # fmt: skip


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
    report = VerifyReport()
    for index, tier in enumerate(byte_tiers):
        found = tier.verify(repair)
        report = found if index == 0 else report.merge(found)
    return report
