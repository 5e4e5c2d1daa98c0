"""The tier list of a `TieredStore`: built from budgets and options, or checked when given; its
stats and `verify` over the list (per-tier occupancy, counters added up).

A store's tiers are one list, fastest first: memory tiers (`MemoryTier`, decoded entries on a
device or in host memory), then byte tiers (`CodedTier`: encoded entries, e.g. the disk). The last
byte tier is the home of every entry. All byte tiers share one codec, so bytes move between them
as they are and the store has one `codec_id`.

A shared byte tier (a remote cache several processes use, `RedisBytes`) is the exception to "the
last byte tier is the home": the home is then the last local one, and every put writes through to
the shared tiers too, so what one process computes, the others load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from functools import reduce
from pathlib import Path

import torch

from .codec_registry import CODECS
from .coded_tier import CodedTier
from .disk import DiskTier
from .memory_tier import DeviceTier, HostTier, MemoryTier
from .settings import StoreBudgets, StoreOptions
from .stats import StoreCounters, StoreStats, TierStats, VerifyReport

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
    """The shared remote tier `options.remote_url` names (the redis client is imported here only)."""
    from .redis_bytes import RedisBytes

    remote = RedisBytes(options.remote_url, budget_bytes, prefix=options.remote_prefix, timeout_s=options.remote_timeout_s,
                        retry_s=options.remote_retry_s, read_only=options.read_only,
                        heat_half_life_s=options.shared_heat_half_life_s)  # fmt: skip
    return CodedTier(remote, codec)


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
    if tiers != memory + coded:
        raise ValueError(f"memory tiers must come before byte tiers (fastest first), got {[t.name for t in tiers]}")
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise ValueError(f"tier names must be unique, got {names}")
    codecs = sorted({t.codec_id for t in coded})
    if len(codecs) > 1:
        raise ValueError(f"byte tiers of one store must share a codec, got {codecs}")
    return memory, coded


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
