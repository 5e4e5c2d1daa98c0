"""`TieredStore`: device -> host -> disk store of KV entries with heat-based placement.

The disk tier (when a directory is given) is the persistent home: every `put` writes through to
it; memory tiers cache entries above it, promoted on access and demoted under pressure by heat
(access count with exponential decay). See `placement.py` for the rules.

Faults of the disk are never fatal to queries: a failed write (full disk, read-only store, lock
timeout) leaves the entry in memory and `put` says whether some tier holds it; ingestion passes
`persist=True` to learn, through `StoreWriteError`, that an entry did not reach the disk. A damaged
index raises `StoreDamagedError` naming the fix. See `disk_tier.py` for the disk's guarantees.

Returned tensors: with the default `copy_on_get`, `get` returns fresh tensors, so callers may do
anything with them. `get(..., copy=False)` returns the tier's own tensors (zero copy): the caller
must treat them as read-only (e.g. copy-on-assemble) or it corrupts the store for everyone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from .disk_tier import DiskTier
from .entry import KVEntry, normalise_token_ids
from .heat import HeatTracker
from .keys import check_key
from .memory_tier import DeviceTier, HostTier, MemoryTier
from .placement import TierStack
from .settings import StoreBudgets, StoreOptions
from .stats import StoreCounters, StoreStats, TierStats
from .verify import VerifyReport

logger = logging.getLogger(__name__)
_NOT_IN_MEMORY = object()


class TieredStore:
    """Content-addressed KV store over device, host and disk tiers (mapping-like, thread-safe).

    Example:
        >>> import torch
        >>> from fusionrag_llm.storage import KVEntry, TieredStore
        >>> e = KVEntry((3, 4), torch.ones(2, 1, 2, 8), torch.zeros(2, 1, 2, 8))
        >>> with TieredStore(None) as store:     # memory only; pass a folder for the disk tier
        ...     store.put("0" * 64, e)
        ...     entry, tier = store.get("0" * 64, expect_token_ids=[3, 4])
        ...     tier, entry.bitwise_equal(e)
        True
        ('host', True)
    """

    def __init__(
        self,
        directory: str | Path | None,
        budgets: StoreBudgets = StoreBudgets(),
        device: torch.device | str | None = None,
        *,
        storage_dtype: torch.dtype | None = None,
        options: StoreOptions = StoreOptions(),
    ):
        if not isinstance(budgets, StoreBudgets) or not isinstance(options, StoreOptions):
            raise ValueError("budgets must be a StoreBudgets and options a StoreOptions")
        memory: list[MemoryTier] = []
        if device is not None and torch.device(device).type != "cpu" and budgets.device_bytes > 0:
            memory.append(DeviceTier(budgets.device_bytes, device))
        if budgets.host_bytes > 0:
            memory.append(HostTier(budgets.host_bytes))
        disk = None
        if directory is not None:
            if budgets.disk_bytes <= 0:
                raise ValueError("StoreBudgets.disk_bytes must be > 0 when a directory is given")
            disk = DiskTier(
                directory,
                budgets.disk_bytes,
                min_file_bytes=options.disk_min_file_bytes,
                timeout_s=options.disk_timeout_s,
                read_only=options.read_only,
            )
        self._setup(memory, disk, storage_dtype, options)

    @classmethod
    def from_tiers(
        cls,
        memory_tiers: Sequence[MemoryTier],
        disk: DiskTier | None = None,
        *,
        storage_dtype: torch.dtype | None = None,
        options: StoreOptions = StoreOptions(),
    ) -> TieredStore:
        """A store over an explicit tier stack, top (fastest) first, e.g. two host tiers in tests."""
        store = cls.__new__(cls)
        store._setup(list(memory_tiers), disk, storage_dtype, options)
        return store

    def _setup(self, memory: list[MemoryTier], disk: DiskTier | None, storage_dtype, options) -> None:
        if not memory and disk is None:
            raise ValueError("a store needs a directory (disk tier) or host_bytes > 0 (memory tier)")
        names = [tier.name for tier in memory] + ([disk.name] if disk is not None else [])
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        if storage_dtype is not None and not isinstance(storage_dtype, torch.dtype):
            raise ValueError(f"storage_dtype must be a torch.dtype or None, got {storage_dtype!r}")
        self._memory, self._disk = memory, disk
        self._storage_dtype, self._options = storage_dtype, options
        self._heat = HeatTracker(options.heat_half_life)
        self._counters = StoreCounters(hits={name: 0 for name in names})
        self._stack = TierStack(memory, disk, self._heat, self._counters)
        self._lock = threading.RLock()
        self._closed = False

    @property
    def directory(self) -> Path | None:
        """The disk tier's folder, or None for a memory-only store."""
        return self._disk.directory if self._disk is not None else None

    @property
    def storage_dtype(self) -> torch.dtype | None:
        """The dtype entries are cast to when stored (None: kept in the dtype they come in)."""
        return self._storage_dtype

    @property
    def read_only(self) -> bool:
        """True when the disk tier takes no writes (read-only folder or `StoreOptions.read_only`)."""
        return self._disk is not None and self._disk.read_only

    @property
    def tier_names(self) -> list[str]:
        """Tier names, top first (e.g. `['device', 'host', 'disk']`)."""
        return [tier.name for tier in self._memory] + ([self._disk.name] if self._disk else [])

    # ----------------------------------------------------------------------------- mapping API
    def put(self, key: str, entry: KVEntry, *, persist: bool = False) -> bool:
        """Store a copy of `entry` (cast to `storage_dtype`); True when some tier holds it.

        When the disk does not take it (full disk or lock timeout: logged; over budget: logged;
        read-only store: said once at open) the entry is kept in memory. With `persist=True`
        (ingestion, which must know what reached the disk) each of those raises `StoreWriteError`
        instead and the entry is not stored anywhere.
        """
        check_key(key)
        self._check_open()
        if not isinstance(entry, KVEntry):
            raise ValueError(f"put expects a KVEntry, got {type(entry).__name__}")
        stored = entry.copy_to("cpu", self._storage_dtype)
        on_disk = self._disk.put(key, stored, persist=persist) if self._disk is not None else False
        with self._lock:
            self._heat.touch(key)
            return self._stack.insert(key, stored, force=not on_disk) or on_disk

    def get(
        self, key: str, expect_token_ids: Iterable[int] | None = None, *, copy: bool | None = None
    ) -> tuple[KVEntry, str] | None:
        """`(entry, tier found in)` or None on a miss.

        With `expect_token_ids`, an entry whose token ids differ is a miss (and a warning). A corrupt
        disk entry is a miss too (deleted, warning). `copy` defaults to `options.copy_on_get`.
        """
        check_key(key)
        self._check_open()
        expected = None if expect_token_ids is None else normalise_token_ids(expect_token_ids)
        copy = self._options.copy_on_get if copy is None else copy
        found = self._get_memory(key, expected)
        if found is _NOT_IN_MEMORY:
            found = self._get_disk(key, expected) if self._disk is not None else None
        if found is None:
            with self._lock:
                self._counters.misses += 1
            return None
        entry, tier = found
        return (entry.copy_to() if copy else entry), tier

    def __contains__(self, key: object) -> bool:
        self._check_open()
        with self._lock:
            if any(key in tier for tier in self._memory):
                return True
        return self._disk is not None and key in self._disk

    def tier_of(self, key: str) -> str | None:
        """Name of the highest tier holding `key`, without counting an access."""
        self._check_open()
        with self._lock:
            for tier in self._memory:
                if key in tier:
                    return tier.name
        return self._disk.name if self._disk is not None and key in self._disk else None

    def delete(self, key: str) -> bool:
        """Remove `key` from every tier; True when some tier held it."""
        check_key(key)
        self._check_open()
        with self._lock:
            removed = self._stack.remove(key)
            self._heat.forget(key)
        on_disk = self._disk.delete(key) if self._disk is not None else False
        return removed or on_disk

    def keys(self) -> list[str]:
        """All keys held by any tier (each once)."""
        self._check_open()
        with self._lock:
            keys = dict.fromkeys(key for tier in self._memory for key in tier.keys())
        if self._disk is not None:
            keys.update(dict.fromkeys(self._disk.keys()))
        return list(keys)

    def stats(self) -> StoreStats:
        """Entries and bytes per tier, and this process's hit/miss/corrupt counters."""
        self._check_open()
        with self._lock:
            tiers = {t.name: TierStats(t.name, len(t), t.used_bytes, t.budget_bytes) for t in self._memory}
            c = self._counters
            stats = StoreStats(
                tiers, dict(c.hits), c.misses, token_mismatches=c.token_mismatches, promotions=c.promotions,
                demotions=c.demotions, evictions=c.evictions,
            )  # fmt: skip
        if self._disk is not None:
            disk = self._disk
            tiers[disk.name] = TierStats(disk.name, len(disk), disk.used_bytes, disk.budget_bytes)
            stats.corrupt, stats.stale, stats.key_mismatches = disk.corrupt_count, disk.stale_count, disk.key_mismatches
            stats.disk_evictions, stats.disk_write_failures = disk.evictions, disk.write_failures
            stats.read_only = disk.read_only
        return stats

    def verify(self, repair: bool = False) -> VerifyReport:
        """Check every disk entry and the store folder; see `DiskTier.verify` for what `repair` removes."""
        self._check_open()
        return self._disk.verify(repair) if self._disk is not None else VerifyReport()

    def clear(self) -> None:
        """Remove every entry from every tier (the disk directory too)."""
        self._check_open()
        with self._lock:
            for tier in self._memory:
                tier.clear()
            self._heat.clear()
        if self._disk is not None:
            self._disk.clear()

    def close(self) -> None:
        """Release memory tiers and the disk handle; further use raises `RuntimeError`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for tier in self._memory:
                tier.clear()
        if self._disk is not None:
            self._disk.close()

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        tiers = ", ".join(repr(t) for t in [*self._memory, *([self._disk] if self._disk else [])])
        return f"TieredStore([{tiers}])"

    # ----------------------------------------------------------------------------- placement
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("TieredStore is closed")

    def _tokens_match(self, key: str, entry: KVEntry, expected: tuple[int, ...] | None) -> bool:
        if expected is None or entry.token_ids == expected:
            return True
        with self._lock:
            self._counters.token_mismatches += 1
        logger.warning(
            "store entry %s holds %d token ids that differ from the %d expected; treated as a miss",
            key, entry.num_tokens, len(expected),
        )
        return False

    def _get_memory(self, key: str, expected) -> tuple[KVEntry, str] | None | object:
        """A hit, None for a token-id mismatch, or `_NOT_IN_MEMORY`."""
        with self._lock:
            self._heat.touch(key)
            found = self._stack.find(key)
            if found is None:
                return _NOT_IN_MEMORY
            level, entry = found
            if not self._tokens_match(key, entry, expected):
                return None
            tier = self._memory[level].name
            self._counters.hit(tier)
            return self._stack.promote(level, key, entry), tier

    def _get_disk(self, key: str, expected) -> tuple[KVEntry, str] | None:
        entry = self._disk.get(key)  # disk I/O and decoding outside the lock
        if entry is None or not self._tokens_match(key, entry, expected):
            return None
        with self._lock:
            self._counters.hit(self._disk.name)
            return self._stack.cache_from_disk(key, entry), self._disk.name
