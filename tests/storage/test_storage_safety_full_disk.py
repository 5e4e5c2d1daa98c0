"""A failed disk write is never fatal: the entry stays in memory, nothing partial stays on disk,
ingestion can ask to be told (`persist=True` raises `StoreWriteError`), and `verify(repair=True)`
reclaims old files no row references."""

import errno
import logging
import os
import resource
import signal
import sqlite3
import time

import pytest
from storage_testutil import key_for, make_entry
from test_storage_safety_helpers import mounted, orphan_name, unreferenced_files

from fusionrag_llm.storage import StoreBudgets, StoreOptions, StoreWriteError, TieredStore, entry_files

OPTIONS = StoreOptions(disk_min_file_bytes=16 * 1024)
BUDGETS = StoreBudgets(host_bytes=2**26, disk_bytes=2**30)


def _big(seed):
    return make_entry(seed, 300, layers=4)  # ~150 KiB: a file


def test_full_file_system_keeps_queries_going_and_leaves_nothing_partial(tmp_path, caplog):
    with mounted(tmp_path / "small", tmpfs_size="2m") as mount:
        ballast = mount / "ballast"
        ballast.write_bytes(b"\0" * 400 * 1024)  # freed later to show writes recover
        folder = mount / "store"
        store = TieredStore(folder, BUDGETS, options=OPTIONS)
        try:
            with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage"):
                for seed in range(20):  # 3 MiB of entries into a 2 MiB file system
                    assert store.put(key_for(seed, 300), _big(seed))  # memory takes what disk cannot
            stats = store.stats()
            assert stats.disk_write_failures >= 1 and 0 < stats.tiers["disk"].entries < 20
            assert "could not write entry" in caplog.text and str(folder) in caplog.text
            assert unreferenced_files(folder) == set()  # no partial file left behind
            for seed in range(20):
                assert store.get(key_for(seed, 300))[0].bitwise_equal(_big(seed))
            with pytest.raises(StoreWriteError) as info:
                store.put(key_for(99, 300), _big(99), persist=True)
            error = info.value
            assert error.directory == folder and error.key == key_for(99, 300) and error.cause is not None
            assert str(folder) in str(error) and key_for(99, 300) in str(error) and isinstance(error, OSError)
            assert unreferenced_files(folder) == set() and store.verify().ok
            ballast.unlink()
            assert store.put(key_for(99, 300), _big(99), persist=True)
            assert store.tier_of(key_for(99, 300)) in ("host", "disk") and key_for(99, 300) in store.keys()
        finally:
            store.close()


@pytest.fixture
def file_size_limit():
    """Call it with a byte count: from then on no file of this process grows past it (the write
    fails with EFBIG half-way, as a full disk fails it with ENOSPC); restored after the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
    yield lambda limit: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, handler)


def test_error_half_way_through_a_file_write_removes_the_partial_file(tmp_path, file_size_limit, caplog):
    # Stand-in for the tmpfs test above (which needs mount permission): a file size limit below the
    # entry's size makes the kernel take the first part of the file, then refuse the rest.
    folder = tmp_path / "store"
    with TieredStore(folder, BUDGETS, options=OPTIONS) as store:
        file_size_limit(64 * 1024)  # the entries are ~150 KiB; the index is not written before the file
        with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage"):
            assert store.put(key_for(1, 300), _big(1))
        with pytest.raises(StoreWriteError) as info:
            store.put(key_for(2, 300), _big(2), persist=True)
        file_size_limit(resource.RLIM_INFINITY)
        assert info.value.errno == errno.EFBIG and isinstance(info.value.cause, OSError)
        assert store.tier_of(key_for(1, 300)) == "host" and "File too large" in caplog.text
        assert entry_files(folder) == [] and store.stats().disk_write_failures == 2  # no partial file left
        assert store.put(key_for(2, 300), _big(2), persist=True) and store.tier_of(key_for(2, 300)) is not None
    with TieredStore(folder, BUDGETS, options=OPTIONS) as reopened:
        assert reopened.get(key_for(2, 300))[0].bitwise_equal(_big(2)) and reopened.verify().ok


def test_lock_timeout_is_a_failed_write_without_leftovers(tmp_path):
    folder = tmp_path / "store"
    with TieredStore(folder, BUDGETS, options=StoreOptions(disk_min_file_bytes=16 * 1024, disk_timeout_s=0.2)) as store:
        other = sqlite3.connect(folder / "cache.db", timeout=0, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another writer holds the write lock past our timeout
        try:
            assert store.put(key_for(1, 300), _big(1)) and store.tier_of(key_for(1, 300)) == "host"
            with pytest.raises(StoreWriteError, match="locked") as info:
                store.put(key_for(2, 300), _big(2), persist=True)
            assert isinstance(info.value.cause, TimeoutError)
            assert list(entry_files(folder)) == []  # the value file written before the lock wait is gone
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert store.put(key_for(2, 300), _big(2), persist=True)


def test_persist_reports_an_entry_the_disk_budget_refuses(tmp_path):
    with TieredStore(tmp_path / "s", StoreBudgets(disk_bytes=4096)) as store:
        assert store.put(key_for(1, 300), _big(1))  # kept in memory
        with pytest.raises(StoreWriteError, match="exceed the disk budget") as info:
            store.put(key_for(2, 300), _big(2), persist=True)
        assert isinstance(info.value.cause, ValueError) and store.get(key_for(2, 300)) is None


def test_verify_repair_reclaims_old_unreferenced_files_only(tmp_path):
    folder = tmp_path / "store"
    with TieredStore(folder, options=OPTIONS) as store:
        store.put(key_for(1, 300), _big(1))
        key = f"{7:064x}"
        old, young, old_temp, old_layout = (folder / name for name in (
            orphan_name(1), orphan_name(2), f"{key[:2]}/.{key}.{1:016x}.tmp", f"ab/cd/{1:028x}.val"))  # fmt: skip
        others = [folder / "documents" / f"{key}.val", folder / "zz" / f"{key}.val"]  # not the store's layout
        for path in (old, young, old_temp, old_layout, *others):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"left by a writer killed before its row was committed")
        an_hour_ago = time.time() - 3600
        for path in (old, old_temp, old_layout, *others):
            os.utime(path, (an_hour_ago, an_hour_ago))
        expected = sorted(str(p.relative_to(folder)) for p in (old, old_temp, old_layout))
        report = store.verify()
        assert sorted(report.orphan_files) == expected and not report.repaired and old.exists()
        assert sorted(store.verify(repair=True).orphan_files) == expected
        assert not any(p.exists() for p in (old, old_temp, old_layout)) and young.exists()  # a young file may be a live writer's
        assert all(p.exists() for p in others)
        assert store.verify().ok and store.get(key_for(1, 300)) is not None


def test_a_relative_store_folder_on_a_full_disk_fails_each_write_with_the_disk_error(tmp_path, monkeypatch, caplog):
    """ENOSPC injected into the entry file writes of a store opened by a relative path: each write is
    a `StoreWriteError` naming the folder and the cause (never a path error of the store's own)."""
    monkeypatch.chdir(tmp_path)
    real_fdopen = os.fdopen

    class FullDisk:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    def fdopen(fd, mode="r", *args, **kwargs):
        handle = real_fdopen(fd, mode, *args, **kwargs)
        return FullDisk(handle) if "w" in mode else handle

    with TieredStore("kv/store", BUDGETS, options=OPTIONS) as store:
        monkeypatch.setattr(os, "fdopen", fdopen)
        with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage"):
            assert store.put(key_for(1, 300), _big(1))  # kept in memory, the failure logged
        for seed in (2, 3):
            with pytest.raises(StoreWriteError) as info:
                store.put(key_for(seed, 300), _big(seed), persist=True)
            assert info.value.errno == errno.ENOSPC and "No space left on device" in str(info.value)
            assert info.value.directory == tmp_path / "kv" / "store" and info.value.key == key_for(seed, 300)
        assert "No space left on device" in caplog.text and store.stats().disk_write_failures == 3
        monkeypatch.setattr(os, "fdopen", real_fdopen)
        assert entry_files(tmp_path / "kv" / "store") == []  # nothing partial left
        assert store.put(key_for(4, 300), _big(4), persist=True)


def _reopen_full(folder, caplog):
    """Open `folder` on a disk that takes no more bytes: read-only for this process, hits served."""
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage"):
        store = TieredStore(folder, StoreBudgets(host_bytes=0), options=OPTIONS)
    with store:
        assert store.read_only and "is the disk full?" in caplog.text and str(folder) in caplog.text
        assert store.get(key_for(1, 300))[0].bitwise_equal(_big(1))
        assert not store.put(key_for(2, 300), _big(2))  # skipped, said once at open
        with pytest.raises(StoreWriteError):
            store.put(key_for(2, 300), _big(2), persist=True)


def test_reopening_a_store_whose_disk_takes_no_more_bytes_serves_hits(tmp_path, file_size_limit, caplog):
    # SQLite must size the -shm file of a WAL index before it reads anything; a file size limit
    # fails that write as a full disk does (tmpfs stand-in: see the next test)
    folder = tmp_path / "store"
    with TieredStore(folder, BUDGETS, options=OPTIONS) as store:
        assert store.put(key_for(1, 300), _big(1))
    file_size_limit(1024)
    _reopen_full(folder, caplog)
    file_size_limit(resource.RLIM_INFINITY)
    with TieredStore(folder, BUDGETS, options=OPTIONS) as store:  # space again: writable again
        assert not store.read_only and store.put(key_for(2, 300), _big(2), persist=True)


def test_reopening_a_store_on_a_full_file_system_serves_hits(tmp_path, caplog):
    with mounted(tmp_path / "small", tmpfs_size="1m") as mount:
        folder = mount / "store"
        with TieredStore(folder, BUDGETS, options=OPTIONS) as store:
            assert store.put(key_for(1, 300), _big(1))
        with pytest.raises(OSError):
            (mount / "ballast").write_bytes(b"\0" * 2**20)  # fills the rest
        _reopen_full(folder, caplog)
