"""`ByteTier`: the shape of a tier that keeps encoded entries (bytes) by store key.

The disk (`DiskBytes`, a SQLite index and files) is one such tier; a remote cache (Redis, say) or a dict
in a test is another. Byte tiers know nothing of tensors or codecs: `CodedTier` puts a codec in
front of one, checks every value it reads (checksum, key binding, codec) and asks the tier to
`discard` a corrupt value. Memory and device tiers, which hold decoded entries, are `MemoryTier`s.

A byte tier keeps itself within `budget_bytes` (evicting what it chooses), and never raises on a
failed write unless `persist=True` (then `StoreWriteError`), so a full disk or a lost connection
costs a recompute, not a query.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .errors import StoreWriteError
from .frame import CorruptEntryError
from .stats import TierStats, VerifyReport

logger = logging.getLogger(__name__)

Problem = tuple[str, str]  # (VerifyReport field: "corrupt", "stale" or "mismatched", detail)
Classify = Callable[[str, bytes], "Problem | None"]


@runtime_checkable
class ByteTier(Protocol):
    """Encoded entries by store key, within a byte budget; thread-safe.

    Counters (this process): `evictions` (values removed to stay within the budget),
    `write_failures` (writes that failed: full disk, lost connection...) and `corrupt_count` (values
    the tier refused to read itself, e.g. rows in a form it never writes).
    """

    name: str
    evictions: int
    write_failures: int
    corrupt_count: int

    @property
    def read_only(self) -> bool: ...

    @property
    def budget_bytes(self) -> int: ...

    @property
    def used_bytes(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...

    def __len__(self) -> int: ...

    def keys(self) -> list[str]: ...

    def get(self, key: str) -> bytes | None:
        """The value stored under `key`, or None (absent or unreadable: logged by the tier)."""

    def put(self, key: str, data: bytes, *, persist: bool = False) -> bool:
        """Store `data` under `key`; True when stored. False (logged) when refused or failed, or
        `StoreWriteError` with `persist=True`."""

    def delete(self, key: str) -> bool:
        """Remove `key`; False when absent or read-only, `StoreWriteError` when the removal fails."""

    def discard(self, key: str, data: bytes) -> bool:
        """Remove `key` only while it still holds `data` (a value found corrupt): a value another
        process wrote meanwhile is kept. Never raises for a failed removal (logged)."""

    def verify(self, classify: Classify, repair: bool = False) -> VerifyReport:
        """Pass every value to `classify` and report the problems; corrupt values are removed, the
        others only with `repair` (see `VerifyReport`)."""

    def stats(self) -> TierStats: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...


def verify_values(tier: ByteTier, classify: Classify, repair: bool, read=None) -> VerifyReport:
    """`ByteTier.verify` over every value: `read(key)` (default `tier.get`) gives its bytes, `classify`
    its problem; corrupt values are removed, the others with `repair` (never on a read-only tier).
    A value `read` refuses (`CorruptEntryError`) is corrupt; one it cannot read (`OSError`), missing."""
    writable = not tier.read_only
    report = VerifyReport(repaired=repair and writable, read_only=not writable)
    for key in tier.keys():
        data = None
        try:
            data = (read or tier.get)(key)
            if data is None:
                continue  # removed meanwhile
            problem = classify(key, data)
        except CorruptEntryError as exc:  # e.g. the disk's UnsafeValueError: a link, a FIFO, a text value
            problem = "corrupt", str(exc)
        except OSError as exc:
            problem = "missing_files", f"its file is missing or unreadable ({exc.strerror or exc})"
        report.checked += 1
        if problem is None:
            continue
        getattr(report, problem[0]).append(key)
        remove = writable and (report.repaired or problem[0] == "corrupt")
        where = getattr(tier, "where", tier.name)
        logger.warning("verify: entry %s in %s: %s%s", key, where, problem[1], "; removed" if remove else "")
        if remove:
            tier.discard(key, data)
    return report


class ByteTierBase:
    """What the disk and remote byte tiers share: counters, `stats`, and refusing a write.

    A subclass sets `name`, `where` (the folder or server, for messages), `budget_bytes` and
    `read_only`, and has `__len__` and `used_bytes`.
    """

    def __init__(self) -> None:
        self.corrupt_count = self.evictions = self.write_failures = 0
        self._lock = threading.Lock()

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def stats(self) -> TierStats:
        return TierStats(self.name, len(self), self.used_bytes, self.budget_bytes)

    def refuse(self, key: str, persist: bool, cause: BaseException) -> bool:
        """False, or with `persist` the `StoreWriteError` saying why `key` was not stored."""
        if persist:
            raise StoreWriteError(self.where, key, cause)
        return False

    def refused_put(self, key: str, data: bytes, persist: bool) -> bool | None:
        """`refuse` a put this tier cannot take (read-only, or `data` over the whole budget); None otherwise."""
        if self.read_only:
            return self.refuse(key, persist, OSError(errno.EROFS, f"the {self.name} tier is read-only"))
        if len(data) > self.budget_bytes:
            logger.warning("%s tier: entry %s of %d bytes exceeds the %s budget of %d bytes; not stored",
                           self.name, key, len(data), self.name, self.budget_bytes)  # fmt: skip
            return self.refuse(key, persist, ValueError(f"{len(data)} bytes exceed the {self.name} budget of "
                                                        f"{self.budget_bytes}"))  # fmt: skip
        return None

    def verify(self, classify: Classify, repair: bool = False) -> VerifyReport:
        return verify_values(self, classify, repair)
