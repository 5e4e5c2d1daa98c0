"""`TieredStore`: device -> host -> byte tiers (disk) store of KV entries with heat-based placement.

The tiers are one list, fastest first (see `tier_list.py`): memory tiers hold decoded entries (in
their `stored_form`: packed by a quantizing codec, see `quant_codec.py`), byte
tiers (a codec over a `ByteTier`: the disk, or a remote cache) hold encoded ones. The last local
byte tier is the persistent home: every `put` writes through to it, and to the shared ones (a
remote cache other processes read; best effort); the other tiers cache entries,
promoted on access and demoted under pressure by heat (access count with exponential decay). See
`tier_list.py` for the rules.

Faults of the disk are never fatal to queries: a failed write (full disk, read-only store, lock
timeout) leaves the entry in memory and `put` says whether some tier holds it; ingestion passes
`persist=True` to learn, through `StoreWriteError`, that an entry did not reach the disk. A damaged
index raises `StoreDamagedError` naming the fix. See `disk.py` for the disk's guarantees.

Returned tensors: with the default `copy_on_get`, `get` returns fresh tensors, so callers may do
anything with them. `get(..., copy=False)` returns the tier's own tensors (zero copy): the caller
must treat them as read-only (e.g. copy-on-assemble) or it corrupts the store for everyone, and
should pin them (`get(..., pin=True)` then `unpin`, or `with store.pinned(keys)`) while it reads
them, so that eviction neither drops nor moves them meanwhile (see `pins.py`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from .codec_registry import CODECS
from .disk import DiskTier
from .entry import KVEntry, normalise_token_ids
from .errors import StoreWriteError
from .heat import HeatTracker
from .keys import check_key
from .pins import PinningMixin, PinTable
from .record_log import FileRecordLog, MemoryRecordLog, RecordLog
from .settings import StoreBudgets, StoreOptions
from .stats import StoreCounters, StoreStats, VerifyReport
from .tier_list import (Tier, TierStack, add_byte_tier_stats, default_tiers, home_tier, memory_stats, split_tiers,
                        verify_tiers)

logger = logging.getLogger(__name__)
_NOT_IN_MEMORY = object()


class TieredStore(PinningMixin):
    """Content-addressed KV store over a list of tiers, fastest first (mapping-like, thread-safe).

    `TieredStore(directory, budgets, device, storage_dtype=..., options=...)` builds the default
    list: a device tier (on an accelerator), a host tier and a disk tier (given a directory) using
    `options.codec`. `TieredStore.from_tiers([...])` takes any list of memory tiers then byte tiers.

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
        self._setup(default_tiers(directory, budgets, device, options), storage_dtype, options)

    @classmethod
    def from_tiers(
        cls,
        tiers: Sequence[Tier],
        disk: DiskTier | None = None,
        *,
        storage_dtype: torch.dtype | None = None,
        options: StoreOptions = StoreOptions(),
    ) -> TieredStore:
        """A store over an explicit tier list, fastest first: memory tiers, then byte tiers
        (`CodedTier`s, the last one the home of every entry). `disk` is appended when given."""
        store = cls.__new__(cls)
        store._setup([*tiers, *([disk] if disk is not None else [])], storage_dtype, options)
        return store

    def _setup(self, tiers: list[Tier], storage_dtype, options: StoreOptions) -> None:
        memory, byte_tiers = split_tiers(tiers)
        if storage_dtype is not None and not isinstance(storage_dtype, torch.dtype):
            raise ValueError(f"storage_dtype must be a torch.dtype or None, got {storage_dtype!r}")
        self._memory, self._bytes = memory, byte_tiers
        self._codec = byte_tiers[0].codec if byte_tiers else CODECS.get(options.codec)
        self._storage_dtype, self._options = storage_dtype, options
        self._heat = HeatTracker(options.heat_half_life)
        self._counters = StoreCounters(hits={t.name: 0 for t in tiers})
        self._pins = PinTable()
        self._stack = TierStack(memory, byte_tiers, self._heat, self._counters, self._pins)
        self._lock = threading.RLock()
        self._closed = False
        self._record_logs: dict[str, RecordLog] = {}

    @property
    def directory(self) -> Path | None:
        """The disk tier's folder, or None for a store without one."""
        folders = [getattr(t.bytes, "directory", None) for t in self._bytes]
        return next((Path(f) for f in folders if f is not None), None)

    def record_log(self, name: str) -> RecordLog:
        """The append-only log ``name`` that travels with this store (a file in its folder, else kept
        in memory by this store object): the chunk catalog lives in one."""
        with self._lock:
            if name not in self._record_logs:
                folder = self.directory
                self._record_logs[name] = FileRecordLog(folder, name) if folder is not None else MemoryRecordLog(name)
            return self._record_logs[name]

    @property
    def options(self) -> StoreOptions:
        """The settings this store was opened with (plain data: another process can open it alike)."""
        return self._options

    @property
    def storage_dtype(self) -> torch.dtype | None:
        """The dtype entries are cast to when stored (None: kept in the dtype they come in)."""
        return self._storage_dtype

    @property
    def codec_id(self) -> str:
        """Id of the codec the byte tiers store entries with (`options.codec` for a memory-only
        store); part of what an entry is, so the engine folds it into its keys."""
        return self._bytes[0].codec_id if self._bytes else self._options.codec

    @property
    def read_only(self) -> bool:
        """True when the home tier (the disk) takes no writes (read-only folder or `StoreOptions.read_only`)."""
        home = home_tier(self._bytes)
        return home is not None and home.read_only

    @property
    def tier_names(self) -> list[str]:
        """Tier names, top first (e.g. `['device', 'host', 'disk']`)."""
        return [tier.name for tier in [*self._memory, *self._bytes]]

    # ----------------------------------------------------------------------------- mapping API
    def put(self, key: str, entry: KVEntry, *, persist: bool = False, exact: bool = False) -> bool:
        """Store a copy of `entry` in its `stored_form`; True when some tier holds it.

        `exact=True` keeps the entry's own dtype (no cast to `storage_dtype`): an exact entry beside
        approximate ones. A quantizing codec's tiers keep packed entries only: `ValueError` there.

        It goes to the home tier (the disk) and the lowest memory tier. When the home does not take
        it (full disk or lock timeout: logged; over budget: logged; read-only store: said once at
        open) the entry is kept in memory. With `persist=True` (ingestion, which must know what
        reached the disk) each of those raises `StoreWriteError` instead and the entry is not
        stored anywhere.
        """
        check_key(key)
        self._check_open()
        if not isinstance(entry, KVEntry):
            raise ValueError(f"put expects a KVEntry, got {type(entry).__name__}")
        stored = self.stored_form(entry, exact=exact)
        on_home, on_shared = self._write_through(key, stored, persist)
        self._forget_above_home(key)
        with self._lock:
            self._heat.touch(key)
            return self._stack.insert(key, stored, force=not on_home) or on_home or on_shared

    def _write_through(self, key: str, stored: KVEntry, persist: bool) -> tuple[bool, bool]:
        """Write `stored` to the home and to the writable shared tiers, encoded once: (on home, on one
        shared tier). Only the home's failure raises with `persist`; a shared tier's is logged."""
        home = home_tier(self._bytes)
        targets = [t for t in self._bytes if t is home or (t.shared and not t.read_only)]
        if not targets:
            return False, False
        data = b"" if all(t.read_only for t in targets) else targets[0].encode(key, stored)
        on_home = on_shared = False
        for tier in targets:
            if tier is home:
                on_home = tier.put_bytes(key, data, persist=persist)
            else:
                on_shared = tier.put_bytes(key, data) or on_shared
        return on_home, on_shared

    def stored_form(self, entry: KVEntry, exact: bool = False) -> KVEntry:
        """A copy of `entry` as this store keeps it: cast to `storage_dtype` (unless `exact`), then
        packed by the codec when it quantizes (`compress`, on the host). Callers that use an entry they
        just computed use this form, so a key gives the same numbers whether the entry is fresh or read
        back. An unpacked copy stays on the entry's device: a GPU entry bound for the device tier is not
        sent to the host and back (the byte tiers copy it to the host as they encode it)."""
        compress = getattr(self._codec, "compress", None)
        if compress is None:
            return entry.copy_to(None, None if exact else self._storage_dtype)
        if exact:
            raise ValueError(f"codec {self.codec_id!r} keeps packed entries only; this store holds no exact entries")
        if self._storage_dtype is not None and not entry.extras:
            entry = entry.copy_to(dtype=self._storage_dtype)
        packed = compress(entry)
        return packed.copy_to("cpu") if packed is entry else packed.to("cpu")

    def _forget_above_home(self, key: str) -> None:
        """Drop an older value of `key` from the local byte tiers that cache the home (best effort)."""
        home = home_tier(self._bytes)
        for tier in self._bytes:
            if tier is home or tier.shared:
                continue
            try:
                tier.delete(key)
            except StoreWriteError as exc:
                logger.warning("%s tier kept an older value of %s: %s", tier.name, key, exc)

    def get(
        self, key: str, expect_token_ids: Iterable[int] | None = None, *, copy: bool | None = None, pin: bool = False
    ) -> tuple[KVEntry, str] | None:
        """`(entry, tier found in)` or None on a miss.

        With `expect_token_ids`, an entry whose token ids differ is a miss (and a warning). A corrupt
        stored entry is a miss too (deleted, warning). `copy` defaults to `options.copy_on_get`.
        `pin=True` pins the key on a hit, in the same step as the lookup (call `unpin` when done).
        """
        check_key(key)
        self._check_open()
        expected = None if expect_token_ids is None else normalise_token_ids(expect_token_ids)
        copy = self._options.copy_on_get if copy is None else copy
        found = self._get_memory(key, expected, pin)
        if found is _NOT_IN_MEMORY:
            found = self._get_below(key, expected, pin)
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
        return any(key in tier for tier in self._bytes)

    def tier_of(self, key: str) -> str | None:
        """Name of the highest tier holding `key`, without counting an access."""
        self._check_open()
        with self._lock:
            for tier in self._memory:
                if key in tier:
                    return tier.name
        return next((tier.name for tier in self._bytes if key in tier), None)

    def delete(self, key: str) -> bool:
        """Remove `key` from every tier; True when some tier held it. A pinned key is removed too
        (its holders keep their tensors; its pin count stays until they unpin)."""
        check_key(key)
        self._check_open()
        with self._lock:
            removed = self._stack.remove(key)
            self._heat.forget(key)
        on_bytes = [tier.delete(key) for tier in self._bytes]
        return removed or any(on_bytes)

    def keys(self) -> list[str]:
        """All keys held by any tier (each once)."""
        self._check_open()
        with self._lock:
            keys = dict.fromkeys(key for tier in self._memory for key in tier.keys())
        for tier in self._bytes:
            keys.update(dict.fromkeys(tier.keys()))
        return list(keys)

    def stats(self) -> StoreStats:
        """Entries and bytes per tier, and this process's hit/miss/corrupt/pin counters."""
        self._check_open()
        with self._lock:
            stats = memory_stats(self._memory, self._counters, len(self._pins))
        return add_byte_tier_stats(stats, self._bytes)

    def verify(self, repair: bool = False) -> VerifyReport:
        """Check every stored entry and the store folder; see `DiskBytes.verify` for what `repair` removes."""
        self._check_open()
        return verify_tiers(self._bytes, repair)

    def clear(self) -> None:
        """Remove every entry from every tier (the disk directory too); pins stay with their holders."""
        self._check_open()
        with self._lock:
            for tier in self._memory:
                tier.clear()
            self._heat.clear()
        for tier in self._bytes:
            tier.clear()

    def close(self) -> None:
        """Release memory tiers and the byte tiers' handles; further use raises `RuntimeError`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for tier in self._memory:
                tier.clear()
        for tier in self._bytes:
            tier.close()

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TieredStore([{', '.join(repr(t) for t in [*self._memory, *self._bytes])}])"

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

    def _get_memory(self, key: str, expected, pin: bool) -> tuple[KVEntry, str] | None | object:
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
            held = self._stack.promote(level, key, entry)
            if pin:
                self._pins.pin(key)
            return held, tier

    def _get_below(self, key: str, expected, pin: bool) -> tuple[KVEntry, str] | None:
        """Read through the byte tiers, fastest first; a hit is copied up into the faster ones."""
        for level, tier in enumerate(self._bytes):
            found = tier.fetch(key)  # I/O and decoding outside the lock
            if found is None:
                continue
            entry, data = found
            if not self._tokens_match(key, entry, expected):
                return None
            for upper in self._bytes[:level]:
                if not upper.read_only:
                    upper.put_bytes(key, data)
            with self._lock:
                self._counters.hit(tier.name)
                held = self._stack.cache_from_below(key, entry)
                if pin:
                    self._pins.pin(key)
                return held, tier.name
        return None
