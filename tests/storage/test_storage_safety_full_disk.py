"""A failed disk write is never fatal: the entry stays in memory, nothing partial stays on disk,
ingestion can ask to be told (`persist=True` raises `StoreWriteError`), and `verify(repair=True)`
reclaims old files no row references."""

import errno
import logging
import os
import sqlite3
import time

import pytest
from storage_testutil import key_for, make_entry
from test_storage_safety_helpers import fake_entry_name, mounted, unreferenced_files

from fusionrag_llm.storage import StoreBudgets, StoreOptions, StoreWriteError, TieredStore
from fusionrag_llm.storage.safe_disk import SafeDisk, entry_files

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


def test_error_half_way_through_a_file_write_removes_the_partial_file(tmp_path, monkeypatch, caplog):
    # Unit-level stand-in for the tmpfs test above (which needs mount permission): no real disk can
    # be made to fail half-way through one write() on demand, so the file-write seam raises ENOSPC.
    seen = []

    def half_then_full(self, handle, data):
        handle.write(data[: len(data) // 2])
        handle.flush()
        seen.append(os.path.getsize(handle.name if isinstance(handle.name, str) else f"/proc/self/fd/{handle.name}"))
        raise OSError(errno.ENOSPC, "No space left on device")

    folder = tmp_path / "store"
    with TieredStore(folder, BUDGETS, options=OPTIONS) as store:
        monkeypatch.setattr(SafeDisk, "_write_all", half_then_full)
        with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage"):
            assert store.put(key_for(1, 300), _big(1))
        assert seen and seen[0] > 0  # a partial file did exist ...
        assert list(entry_files(folder)) == []  # ... and was removed
        assert store.tier_of(key_for(1, 300)) == "host" and "No space left" in caplog.text
        with pytest.raises(StoreWriteError) as info:
            store.put(key_for(2, 300), _big(2), persist=True)
        assert info.value.errno == errno.ENOSPC and isinstance(info.value.cause, OSError)
        assert list(entry_files(folder)) == [] and store.stats().disk_write_failures == 2
        monkeypatch.undo()
        assert store.put(key_for(2, 300), _big(2), persist=True) and store.tier_of(key_for(2, 300)) is not None


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
        old, young = folder / fake_entry_name(1), folder / fake_entry_name(2)
        for path in (old, young, folder / "documents" / "a.val", folder / "zz" / "cd" / f"{0:028x}.val"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"left by a writer killed before its row was committed")
        an_hour_ago = time.time() - 3600
        for path in (old, folder / "documents" / "a.val", folder / "zz" / "cd" / f"{0:028x}.val"):
            os.utime(path, (an_hour_ago, an_hour_ago))
        report = store.verify()
        assert report.orphan_files == [fake_entry_name(1)] and not report.repaired and old.exists()
        assert store.verify(repair=True).orphan_files == [fake_entry_name(1)]
        assert not old.exists() and young.exists()  # a young file may be a live writer's
        assert (folder / "documents" / "a.val").exists() and (folder / "zz" / "cd" / f"{0:028x}.val").exists()
        assert store.verify().ok and store.get(key_for(1, 300)) is not None


def test_a_parent_folder_removed_by_another_process_mid_write_is_made_again(tmp_path, monkeypatch):
    """Another process prunes an emptied sub-folder just as this one creates it: the write retries."""
    import fusionrag_llm.storage.safe_disk as safe_disk

    real, raced = os.makedirs, []

    def racing(name, *args, **kwargs):
        if not raced:  # the parent vanished between makedirs' creating it and its leaf
            raced.append(name)
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(safe_disk.os, "makedirs", racing)
    with TieredStore(tmp_path / "store", BUDGETS, options=OPTIONS) as store:
        assert store.put(key_for(1, 300), _big(1), persist=True)
        assert raced and store.stats().disk_write_failures == 0
    with TieredStore(tmp_path / "store", BUDGETS, options=OPTIONS) as reopened:
        assert reopened.get(key_for(1, 300))[0].bitwise_equal(_big(1))
