"""A hand-written cache.db or planted files must not run code or reach files outside the store folder.

Each test crafts real rows with sqlite3 and real links with the file system, as anyone able to write
the store folder could, then drives every path that reads rows or files: get, keys, len, stats,
verify, delete, eviction, clear, and writes.
"""

import pytest
from storage_testutil import key_for, make_entry
from test_storage_safety_helpers import insert_row, pickle_payload, row_ids, sql

from fusionrag_llm.storage import DiskTier, RawCodec, StoreBudgets, StoreDamagedError, StoreOptions, TieredStore

LARGE = 300  # tokens: a file-backed entry with min_file_bytes below
OPTIONS = StoreOptions(disk_min_file_bytes=16 * 1024)
REAL = [key_for(1), key_for(2, LARGE)]  # the entries every fixture store holds
RAW = RawCodec()  # the bytes a planted entry carries: a valid frame


@pytest.fixture
def folder(tmp_path):
    folder = tmp_path / "store"
    with TieredStore(folder, options=OPTIONS) as store:
        store.put(key_for(1), make_entry(1))
        store.put(key_for(2, LARGE), make_entry(2, LARGE))
    return folder


def _open(folder):
    return TieredStore(folder, StoreBudgets(host_bytes=0), options=OPTIONS)


def _file_of(folder, key):
    return folder / key[:2] / f"{key}.val"


@pytest.mark.parametrize("where", ["in the row", "in a file"])
def test_pickled_value_is_never_unpickled(folder, tmp_path, where):
    marker = tmp_path / "pwned"
    key = key_for(99)

    def forge():
        if where == "in the row":
            return insert_row(folder, key=key, value=pickle_payload(marker))
        _file_of(folder, key).parent.mkdir(exist_ok=True)
        _file_of(folder, key).write_bytes(pickle_payload(marker))
        return insert_row(folder, key=key, size=100)

    forge()
    with _open(folder) as store:
        assert key in store and len(store.keys()) == 3 and store.stats().tiers["disk"].entries == 3
        assert store.get(key) is None and store.stats().corrupt == 1  # refused and dropped like a corrupt entry
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
    forms = [pickle_payload(marker), b"\x00" * 64, "Z" * 64, key_for(4).upper(), key_for(4) + "\n", 7, None]
    foreign = {insert_row(folder, key=key, value=RAW.encode(make_entry(3))) for key in forms}
    tier = DiskTier(folder, 2**24)
    assert sorted(tier.keys()) == sorted(REAL) and len(tier) == 2
    with TieredStore.from_tiers([], tier) as store:
        assert store.stats().tiers["disk"].entries == 2
        report = store.verify()
        assert set(report.foreign_rows) == foreign and foreign <= row_ids(folder)  # listed, kept
        assert set(store.verify(repair=True).foreign_rows) == foreign
        assert not foreign & row_ids(folder) and store.verify().ok
    assert not marker.exists()


def test_eviction_and_clear_pass_over_foreign_rows_without_unpickling(folder, tmp_path):
    marker = tmp_path / "pwned"
    insert_row(folder, key=pickle_payload(marker), value=pickle_payload(marker))
    coldest = insert_row(folder, key=key_for(98), value=pickle_payload(marker), heat=0.0)
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


def _victim_key() -> str:
    """A file-backed entry's key whose sub-folder no entry of the fixture uses."""
    used = {key[:2] for key in REAL}
    return next(key_for(seed, LARGE) for seed in range(50, 99) if key_for(seed, LARGE)[:2] not in used)


@pytest.fixture
def outside(tmp_path):
    """A valid entry bound to `_victim_key()`, alone in a folder outside the store."""
    path = tmp_path / "elsewhere" / f"{_victim_key()}.val"
    path.parent.mkdir()
    path.write_bytes(RAW.encode(make_entry(50, LARGE), key=_victim_key()))
    return path


def _plant_link(folder, outside, how):
    """Make the victim key's file (or its sub-folder) a symlink to the file (folder) outside."""
    key = _victim_key()
    if how == "file link":
        _file_of(folder, key).parent.mkdir(exist_ok=True)
        _file_of(folder, key).unlink(missing_ok=True)
        _file_of(folder, key).symlink_to(outside)
    elif not (folder / key[:2]).is_symlink():
        (folder / key[:2]).symlink_to(outside.parent, target_is_directory=True)


HOWS = ["file link", "folder link"]


def _assert_intact(outside):
    assert outside.is_file() and not outside.is_symlink()
    assert outside.read_bytes() == RAW.encode(make_entry(50, LARGE), key=_victim_key())
    assert [p.name for p in outside.parent.iterdir()] == [outside.name]  # nothing written beside it


@pytest.mark.parametrize("how", HOWS)
def test_file_outside_the_store_is_never_read(folder, outside, how):
    key = _victim_key()
    _plant_link(folder, outside, how)
    insert_row(folder, key=key, size=100)
    with TieredStore(folder, StoreBudgets(host_bytes=0)) as store:
        # The bytes out there are a valid entry bound to this very key: a hit would prove a read.
        assert store.get(key) is None and key not in store  # refused, and the forged row dropped
        assert store.stats().corrupt == 1
        _plant_link(folder, outside, how)
        insert_row(folder, key=key, size=100)
        assert store.verify().corrupt == [key]
    _assert_intact(outside)


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("action", ["delete", "repair", "clear", "evict"])
def test_file_outside_the_store_is_never_deleted(folder, outside, how, action):
    key = _victim_key()
    _plant_link(folder, outside, how)
    tier = DiskTier(folder, 2**24, min_file_bytes=16 * 1024)
    # size: the forged row claims a huge file, so the next write must evict it (it is also the coldest).
    rowid = insert_row(folder, key=key, size=2**25, heat=0.0)
    if action == "delete":
        assert tier.delete(key)
    elif action == "repair":
        tier.verify(repair=True)
    elif action == "clear":
        tier.clear()
    else:
        assert tier.put(key_for(3), make_entry(3)) and tier.evictions >= 1
    assert rowid not in row_ids(folder)  # the forged row is gone ...
    _assert_intact(outside)  # ... the file behind the link is not, nor its folder
    tier.close()


@pytest.mark.parametrize("how", HOWS)
def test_a_write_never_goes_through_a_link(folder, outside, how):
    key = _victim_key()
    _plant_link(folder, outside, how)
    with TieredStore(folder, StoreBudgets(host_bytes=0), options=OPTIONS) as store:
        stored = store.put(key, make_entry(51, LARGE))  # other bytes than the file outside holds
        if how == "file link":  # the link itself is replaced by the new file
            assert stored and not _file_of(folder, key).is_symlink()
            assert store.get(key)[0].bitwise_equal(make_entry(51, LARGE))
        else:  # a sub-folder that is a link takes no file: a failed write, the entry not stored
            assert not stored and store.stats().disk_write_failures == 1 and key not in store
    _assert_intact(outside)


def test_a_journal_mode_set_in_the_index_is_undone(folder):
    sql(folder, "PRAGMA journal_mode = DELETE")  # weaker crash safety, recorded in the file
    with TieredStore(folder, options=OPTIONS) as store:
        assert store.put(key_for(5), make_entry(5)) and store.get(key_for(5)) is not None
    assert sql(folder, "PRAGMA journal_mode") == [("wal",)]


@pytest.mark.parametrize("name", ["cache.db", "cache.db-wal", "cache.db-shm"])
def test_an_index_file_that_is_a_link_is_refused(folder, tmp_path, name):
    target = tmp_path / f"elsewhere-{name}"
    if name == "cache.db":
        (folder / name).rename(target)
    else:
        target.write_bytes(b"not to be touched")
        (folder / name).unlink(missing_ok=True)
    before = target.read_bytes()
    (folder / name).symlink_to(target)
    with pytest.raises(StoreDamagedError, match="symbolic link"):
        TieredStore(folder, options=OPTIONS)
    assert target.read_bytes() == before
