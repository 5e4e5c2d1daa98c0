"""Checking a disk tier: every entry, every row and every entry file; reported, repaired on request.

Corrupt entries are always removed (as `get` does: they can never be served). The other problems
are listed, and removed only with `repair=True`:

* stale: bytes of another format version or codec (recomputed on the next miss anyway);
* mismatched: a valid entry filed under another key than the one in its bytes;
* missing_files: rows whose file is gone or unreadable;
* foreign_rows: rows not in the store's form (pickled or non-hex keys), listed by rowid; removing
  one never removes a file outside the store folder or one another row still names;
* orphan_files: entry files no row references, e.g. left by a writer killed between writing its file
  and committing its row, or by a full disk. Only files older than `ORPHAN_GRACE_S` count: a live
  writer writes its file a moment before its row, and gives up after its lock timeout.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .disk_index import DiskIndex, Row
from .frame import CorruptEntryError
from .safe_disk import entry_files

logger = logging.getLogger(__name__)
ORPHAN_GRACE_S = 300.0


@dataclass
class VerifyReport:
    """What `verify` found. Keys for entry problems, rowids for foreign rows, relative paths for files.

    `repaired` is True when the problems listed were removed (`repair=True` on a writable store);
    corrupt entries are removed in any case unless the store is `read_only`.
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

    @property
    def problems(self) -> int:
        lists = (self.corrupt, self.stale, self.mismatched, self.missing_files, self.foreign_rows, self.orphan_files)
        return sum(len(found) for found in lists)

    @property
    def ok(self) -> bool:
        return self.problems == 0

    def merge(self, other: VerifyReport) -> VerifyReport:
        """One report for two tiers: counts and lists added, `repaired` only when both were."""
        lists = ("corrupt", "stale", "mismatched", "missing_files", "foreign_rows", "orphan_files")
        merged = VerifyReport(self.checked + other.checked, repaired=self.repaired and other.repaired,
                              read_only=self.read_only or other.read_only)  # fmt: skip
        for name in lists:
            setattr(merged, name, getattr(self, name) + getattr(other, name))
        return merged


class Verifier:
    """One pass of `DiskBytes.verify` over `index`; `classify(key, data)` says what is wrong with a
    value (`(report field, detail)`) or None (`CodedTier.classify` decodes it with its codec)."""

    def __init__(self, index: DiskIndex, repair: bool, classify: Callable[[str, bytes], tuple[str, str] | None] | None):
        self.index, self.repair, self.classify = index, repair, classify
        self.writable = not index.read_only

    def run(self) -> VerifyReport:
        report = VerifyReport(repaired=self.repair and self.writable, read_only=not self.writable)
        for key in self.index.keys():
            self._check_entry(key, report)
        self._check_foreign(report)
        self.reclaim_orphans(report)
        return report

    def _check_entry(self, key: str, report: VerifyReport) -> None:
        row = self.index.row(key)
        if row is None:
            return  # removed by another process meanwhile
        report.checked += 1
        problem = self._problem(row)
        if problem is None:
            return
        kind, detail = problem
        getattr(report, kind).append(key)
        remove = self.writable and (self.repair or kind == "corrupt")
        logger.warning("verify: entry %s in %s: %s%s", key, self.index.directory, detail, "; removed" if remove else "")
        if remove:
            self.index.delete_row(row)

    def _problem(self, row: Row) -> tuple[str, str] | None:
        """`(report field, detail)` of what is wrong with `row`, or None when it holds a valid entry."""
        try:
            data = self.index.read(row)
        except CorruptEntryError as exc:  # UnsafeRowError: pickle, text, a path outside the store
            return "corrupt", str(exc)
        except OSError as exc:
            return "missing_files", f"its file {row.filename!r} is missing or unreadable ({exc.strerror or exc})"
        return self.classify(row.key, data)

    def _check_foreign(self, report: VerifyReport) -> None:
        for row in self.index.foreign_rows():
            report.foreign_rows.append(row.rowid)
            if self.repair and self.writable:
                self.index.delete_row(row, remove_file=not self._shared(row))
        if report.foreign_rows:
            logger.warning("verify: %d rows of %s are not in this store's form (e.g. pickled keys)%s",
                           len(report.foreign_rows), self.index.directory,
                           "; removed" if self.repair and self.writable else "")  # fmt: skip

    def _shared(self, row: Row) -> bool:
        # A forged row may name the file of a real entry: removing the row must not take that file.
        if not isinstance(row.filename, str):
            return False
        return bool(self.index.execute("SELECT 1 FROM Cache WHERE filename = ? AND rowid != ? LIMIT 1",
                                       (row.filename, row.rowid)))  # fmt: skip

    def reclaim_orphans(self, report: VerifyReport) -> None:
        """List (and with `repair`, remove) entry files no row references, older than the grace period."""
        referenced = self.index.referenced_files()
        now = time.time()
        for name in entry_files(self.index.directory):
            if name in referenced:
                continue
            try:
                age = now - os.lstat(self.index.directory / name).st_mtime
            except FileNotFoundError:
                continue
            if age >= ORPHAN_GRACE_S:
                report.orphan_files.append(name)
                if self.repair and self.writable:
                    self.index.disk.remove(name)
        if report.orphan_files:
            logger.warning("verify: %d entry files in %s belong to no entry%s", len(report.orphan_files),
                           self.index.directory, "; removed" if self.repair and self.writable else "")  # fmt: skip
