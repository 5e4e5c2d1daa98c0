"""A damaged, missing or older-format cache.db gives `StoreDamagedError` naming the file and the fix,
and the index can be rebuilt from the entry files (whose bytes carry their key)."""

import errno
import os
import pickle
import sqlite3

import pytest
from storage_testutil import key_for, make_entry

from fusionrag_llm.storage import (
    RawCodec,
    StoreBudgets,
    StoreDamagedError,
    StoreOptions,
    StoreWriteError,
    TieredStore,
    clear_damaged,
    entry_files,
    rebuild_index,
)

OPTIONS = StoreOptions(disk_min_file_bytes=16 * 1024)
SMALL, LARGE = [1, 3, 5], [2, 4, 6]  # seeds of entries kept in the db, and in files


def _tokens(seed):
    return 300 if seed in LARGE else 4


@pytest.fixture
def folder(tmp_path):
    folder = tmp_path / "store"
    with TieredStore(folder, options=OPTIONS) as store:
        for seed in SMALL + LARGE:
            store.put(key_for(seed, _tokens(seed)), make_entry(seed, _tokens(seed)))
    return folder


def _garbage(folder):
    (folder / "cache.db").write_bytes(os.urandom(8192))


def _truncate(folder):
    db = folder / "cache.db"
    with open(db, "r+b") as handle:
        handle.truncate(os.path.getsize(db) // 2)


def _remove(folder):
    (folder / "cache.db").unlink()


DAMAGES = {"garbage": _garbage, "truncated": _truncate, "missing": _remove}


def _use(folder):
    """Open and use the store: the damage must surface as StoreDamagedError, at open or first use."""
    with TieredStore(folder, StoreBudgets(host_bytes=0), options=OPTIONS) as store:
        store.keys()
        for seed in SMALL + LARGE:
            store.get(key_for(seed, _tokens(seed)))


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_index_is_a_clear_error_naming_file_and_fix(folder, damage):
    DAMAGES[damage](folder)
    with pytest.raises(StoreDamagedError) as info:
        _use(folder)
    message = str(info.value)
    assert str(folder / "cache.db") in message
    assert "fusionrag cache verify --repair" in message and "fusionrag cache clear --yes" in message
    assert isinstance(info.value, ValueError) and info.value.directory == folder
    assert damage == "missing" or isinstance(info.value.__cause__, sqlite3.DatabaseError)  # not a raw traceback


@pytest.mark.parametrize("damage", DAMAGES)
def test_rebuild_recovers_file_entries_and_keeps_the_damaged_index(folder, damage):
    original = (folder / "cache.db").read_bytes() if damage != "missing" else None
    DAMAGES[damage](folder)
    damaged = (folder / "cache.db").read_bytes() if damage != "missing" else None
    report = rebuild_index(folder)
    assert sorted(report.recovered) == sorted(key_for(s, 300) for s in LARGE)
    assert report.unreadable == [] and report.duplicates == []
    if damage == "missing":
        assert report.quarantined is None
    else:
        assert report.quarantined.name.startswith("cache.db.damaged-")
        assert report.quarantined.read_bytes() == damaged != original  # kept, never deleted
    if damage == "truncated":
        assert report.lost_in_index in (None, len(SMALL))
    with TieredStore(folder, StoreBudgets(host_bytes=0), options=OPTIONS) as store:
        for seed in LARGE:
            entry, tier = store.get(key_for(seed, 300))
            assert tier == "disk" and entry.bitwise_equal(make_entry(seed, 300))
        for seed in SMALL:  # lived inside the damaged index: lost, recomputed later
            assert store.get(key_for(seed, 4)) is None
        assert store.verify().ok


def test_rebuild_counts_lost_small_entries_when_the_old_index_is_readable(folder):
    sql = sqlite3.connect(folder / "cache.db")
    # Damaged for the store (a column it needs is gone) while its rows can still be counted.
    sql.execute("DROP INDEX entries_heat")
    sql.execute("ALTER TABLE entries RENAME COLUMN heat TO gone")
    sql.commit()
    sql.close()
    with pytest.raises(StoreDamagedError, match="no such column"):
        _use(folder)
    report = rebuild_index(folder)
    assert report.lost_in_index == len(SMALL) and len(report.recovered) == len(LARGE)


def test_rebuild_drops_damaged_files_and_files_under_another_key(folder):
    names = sorted(entry_files(folder))
    victim = folder / names[0]
    victim.write_bytes(victim.read_bytes()[:1000])  # truncated entry file
    misfiled = folder / names[2]
    misfiled.write_bytes((folder / names[1]).read_bytes())  # a valid entry under another key's name
    _garbage(folder)
    report = rebuild_index(folder)
    assert sorted(report.unreadable) == sorted([names[0], names[2]]) and report.duplicates == []
    assert len(report.recovered) == len(LARGE) - 2 and not victim.exists() and not misfiled.exists()
    with TieredStore(folder, options=OPTIONS) as store:
        assert store.verify().ok and len(store.keys()) == len(LARGE) - 2


def test_a_store_of_the_older_format_is_refused_then_rebuilt_from_its_files(tmp_path):
    """diskcache's layout: a `Cache` table, small values inside it, files `ab/cd/<28 hex>.val`."""
    folder = tmp_path / "old"
    folder.mkdir()
    with sqlite3.connect(folder / "cache.db") as db:
        db.execute("CREATE TABLE Cache (rowid INTEGER PRIMARY KEY, key BLOB, raw INTEGER, filename TEXT, value BLOB)")
        db.execute("INSERT INTO Cache (key, raw, filename, value) VALUES (?, 1, NULL, ?)", (key_for(1), b"small"))
    old_files = {seed: folder / "0a" / f"{seed:02x}" / f"{seed:028x}.val" for seed in (2, 4, 7)}
    for seed, path in old_files.items():  # 7: an older second copy of entry 4
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(RawCodec().encode(make_entry(4 if seed == 7 else seed, 300), key=key_for(4 if seed == 7 else seed, 300)))
    os.utime(old_files[7], (1, 1))
    with pytest.raises(StoreDamagedError, match="not an index of this store's format"):
        _use(folder)
    report = rebuild_index(folder)
    assert sorted(report.recovered) == sorted([key_for(2, 300), key_for(4, 300)]) and report.lost_in_index == 1
    assert report.duplicates == ["0a/07/" + old_files[7].name] and not any(p.exists() for p in old_files.values())
    with TieredStore(folder, StoreBudgets(host_bytes=0), options=OPTIONS) as store:
        for seed in (2, 4):
            entry, tier = store.get(key_for(seed, 300))
            assert tier == "disk" and entry.bitwise_equal(make_entry(seed, 300))
        assert store.verify().ok and len(store.keys()) == 2


def test_clear_damaged_starts_empty_and_keeps_the_index(folder):
    _garbage(folder)
    report = clear_damaged(folder)
    assert len(report.cleared) == len(LARGE) and list(entry_files(folder)) == []
    assert report.quarantined.exists() and not (folder / "cache.db").exists()
    with TieredStore(folder, options=OPTIONS) as store:
        assert store.keys() == [] and store.put(key_for(1), make_entry(1))


def test_damage_after_open_surfaces_at_first_use(folder):
    with TieredStore(folder, StoreBudgets(host_bytes=0), options=OPTIONS) as store:
        db = folder / "cache.db"
        with open(db, "r+b") as handle:  # overwritten in place under the open connection
            handle.write(os.urandom(os.path.getsize(db)))
        with pytest.raises(StoreDamagedError, match="cache verify --repair"):
            store.get(key_for(2, 300))
            store.keys()


def test_store_errors_survive_pickling_between_processes(tmp_path):
    damaged = pickle.loads(pickle.dumps(StoreDamagedError(tmp_path, "file is not a database")))
    assert damaged.directory == tmp_path and "verify --repair" in str(damaged)
    failed = pickle.loads(pickle.dumps(StoreWriteError(tmp_path, "ab" * 32, OSError(errno.ENOSPC, "full"))))
    assert failed.key == "ab" * 32 and failed.errno == errno.ENOSPC and str(tmp_path) in str(failed)
