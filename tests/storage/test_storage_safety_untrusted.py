"""A hand-written cache.db must not run code or reach files outside the store folder.

Each test crafts real rows with sqlite3, as anyone able to write the store's cache.db could, then
drives every path that reads rows: get, keys, len, stats, verify, delete, eviction, clear.
"""

import os

import pytest
from storage_testutil import key_for, make_entry
from test_storage_safety_helpers import (
    MODE_BINARY,
    MODE_PICKLE,
    fake_entry_name,
    insert_row,
    pickle_payload,
    row_ids,
    sql,
)

from fusionrag_llm.storage import DiskTier, StoreBudgets, StoreDamagedError, StoreOptions, TieredStore, encode

LARGE = 300  # tokens: a file-backed entry with min_file_bytes below


@pytest.fixture
def folder(tmp_path):
    folder = tmp_path / "store"
    with TieredStore(folder, options=StoreOptions(disk_min_file_bytes=16 * 1024)) as store:
        store.put(key_for(1), make_entry(1))
        store.put(key_for(2, LARGE), make_entry(2, LARGE))
    return folder


def _open(folder):
    return TieredStore(folder, StoreBudgets(host_bytes=0), options=StoreOptions(disk_min_file_bytes=16 * 1024))


@pytest.mark.parametrize("where", ["in the row", "in a file"])
def test_pickled_value_is_never_unpickled(folder, tmp_path, where):
    marker = tmp_path / "pwned"
    key = key_for(99)
    if where == "in a file":
        path = folder / fake_entry_name()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle_payload(marker))

    def forge():
        if where == "in the row":
            return insert_row(folder, key=key, mode=MODE_PICKLE, value=pickle_payload(marker))
        return insert_row(folder, key=key, mode=MODE_PICKLE, filename=fake_entry_name())

    forge()
    with _open(folder) as store:
        assert key in store and len(store.keys()) == 3 and store.stats().tiers["disk"].entries == 3
        assert store.get(key) is None  # refused and dropped like a corrupt entry
        assert key not in store
    forge()
    with _open(folder) as store:
        assert store.verify().corrupt == [key]
        assert store.verify(repair=True).ok
        assert store.get(key_for(2, LARGE))[0].bitwise_equal(make_entry(2, LARGE))  # real entries survive
    forge()
    with _open(folder) as store:
        store.clear()
    assert not marker.exists()


def test_rows_with_foreign_keys_are_ignored_and_never_unpickled(folder, tmp_path):
    marker = tmp_path / "pwned"
    # diskcache unpickles a key whose raw column is 0; the other forms are keys this store never writes.
    forms = [(pickle_payload(marker), 0), (b"\x00" * 64, 1), ("Z" * 64, 1), (key_for(4) + "\n", 1), (7, 1)]
    foreign = {insert_row(folder, key=key, raw=raw, value=encode(make_entry(3))) for key, raw in forms}
    tier = DiskTier(folder, 2**24)
    assert sorted(tier.keys()) == sorted([key_for(1), key_for(2, LARGE)]) and len(tier) == 2
    with TieredStore.from_tiers([], tier) as store:
        assert store.stats().tiers["disk"].entries == 2
        report = store.verify()
        assert set(report.foreign_rows) == foreign and foreign <= row_ids(folder)  # listed, kept
        assert set(store.verify(repair=True).foreign_rows) == foreign
        assert not foreign & row_ids(folder) and store.verify().ok
    assert not marker.exists()


def test_eviction_and_clear_pass_over_foreign_rows_without_unpickling(folder, tmp_path):
    marker = tmp_path / "pwned"
    insert_row(folder, key=pickle_payload(marker), raw=0, mode=MODE_PICKLE, value=pickle_payload(marker))
    coldest = insert_row(folder, key=key_for(98), mode=MODE_PICKLE, value=pickle_payload(marker), access_time=0.0)
    tier = DiskTier(folder, budget_bytes=tier_volume(folder) + 2000, min_file_bytes=16 * 1024)
    for seed in range(10, 20):  # each write evicts the coldest of our entries to stay in budget
        assert tier.put(key_for(seed), make_entry(seed))
    assert tier.evictions > 0 and coldest not in row_ids(folder)  # evicted first, never read
    tier.clear()
    tier.close()
    assert not marker.exists()


def tier_volume(folder) -> int:
    tier = DiskTier(folder, 2**30)
    try:
        return tier.used_bytes
    finally:
        tier.close()


@pytest.fixture
def outside(tmp_path):
    """A valid entry for key 50, bound to that key, alone in a folder outside the store."""
    path = tmp_path / "elsewhere" / "victim.val"
    path.parent.mkdir()
    path.write_bytes(encode(make_entry(50, LARGE), key=key_for(50, LARGE)))
    return path


def _outside_filename(folder, outside, how):
    if how == "absolute":
        return str(outside)
    if how == "dotdot":
        return os.path.join("..", "elsewhere", outside.name)
    link = folder / fake_entry_name(1)  # removing the row may remove the link itself (never its target)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(outside)
    return fake_entry_name(1)


HOWS = ["absolute", "dotdot", "symlink"]


@pytest.mark.parametrize("how", HOWS)
def test_file_outside_the_store_is_never_read(folder, outside, how):
    key = key_for(50, LARGE)
    filename = _outside_filename(folder, outside, how)
    insert_row(folder, key=key, mode=MODE_BINARY, filename=filename, size=100)
    with TieredStore(folder, StoreBudgets(host_bytes=0)) as store:
        # The bytes out there are a valid entry bound to this very key: a hit would prove a read.
        assert store.get(key) is None and key not in store  # refused, and the forged row dropped
        insert_row(folder, key=key, mode=MODE_BINARY, filename=_outside_filename(folder, outside, how), size=100)
        assert store.verify().corrupt == [key]
    _assert_intact(outside, key)


def _assert_intact(outside, key):
    assert outside.is_file() and outside.read_bytes() == encode(make_entry(50, LARGE), key=key)


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("action", ["delete", "repair", "clear", "evict"])
def test_file_outside_the_store_is_never_deleted(folder, outside, how, action):
    key = key_for(50, LARGE)
    filename = _outside_filename(folder, outside, how)
    tier = DiskTier(folder, 2**24, min_file_bytes=16 * 1024)
    # size: the forged row claims a huge file, so the next write must evict it (it is also the coldest).
    rowid = insert_row(folder, key=key, mode=MODE_BINARY, filename=filename, size=2**25, access_time=0.0)
    if action == "delete":
        assert tier.delete(key)
    elif action == "repair":
        tier.verify(repair=True)
    elif action == "clear":
        tier.clear()
    else:
        assert tier.put(key_for(3), make_entry(3)) and tier.evictions >= 1
    assert rowid not in row_ids(folder)  # the forged row is gone ...
    _assert_intact(outside, key)  # ... the file it named is not, nor its folder
    tier.close()


def test_settings_in_cache_db_cannot_steer_the_store(folder):
    sql(folder, "UPDATE Settings SET value = 'off' WHERE key = 'sqlite_journal_mode'")  # weaker crash safety
    sql(folder, "UPDATE Settings SET value = 0 WHERE key = 'disk_min_file_size'")
    with TieredStore(folder, options=StoreOptions(disk_min_file_bytes=16 * 1024)) as store:
        store.put(key_for(5), make_entry(5))  # small: must still live inside the row
        assert store.get(key_for(5)) is not None
    assert sql(folder, "PRAGMA journal_mode") == [("wal",)]
    assert sql(folder, "SELECT filename FROM Cache WHERE key = ?", (key_for(5),)) == [(None,)]
    sql(folder, "INSERT INTO Settings VALUES ('sqlite_query_only', 1)")  # diskcache would run it as a PRAGMA
    with pytest.raises(StoreDamagedError, match="sqlite_query_only"):
        TieredStore(folder)
