"""A store shared read-only opens, serves hits, skips writes and says so once.

Tests run as root here, where `chmod a-w` does not stop writes: the real case uses a read-only
bind mount (skipped where mounting is not permitted); the unit case uses `StoreOptions(read_only=True)`.
"""

import hashlib
import logging

import pytest
import torch
from storage_testutil import key_for, make_entry
from test_storage_safety_helpers import is_read_only_mount, mounted

from fusionrag_llm.storage import StoreBudgets, StoreConfigError, StoreOptions, StoreWriteError, TieredStore, open_store

OPTIONS = StoreOptions(disk_min_file_bytes=16 * 1024)
SEEDS = {1: 4, 2: 300, 3: 4, 4: 300}  # seed -> tokens: entries in the db and in files


def _fill(folder):
    with TieredStore(folder, options=OPTIONS) as store:
        for seed, tokens in SEEDS.items():
            assert store.put(key_for(seed, tokens), make_entry(seed, tokens))


def _digest(folder) -> str:
    return hashlib.sha256((folder / "cache.db").read_bytes()).hexdigest()


def _read_only_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "read-only" in r.getMessage() and r.levelno == logging.WARNING]


def _serves_and_skips_writes(folder, options, caplog):
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage"):
        with TieredStore(folder, options=options) as store:
            assert store.read_only and store.stats().read_only
            for seed, tokens in SEEDS.items():
                entry, tier = store.get(key_for(seed, tokens))
                assert tier == "disk" and entry.bitwise_equal(make_entry(seed, tokens))
            assert store.put(key_for(9), make_entry(9))  # the host tier took it
            assert store.tier_of(key_for(9)) == "host"
            with pytest.raises(StoreWriteError, match="read-only"):
                store.put(key_for(10), make_entry(10), persist=True)
            assert sorted(store.keys()) == sorted([key_for(s, t) for s, t in SEEDS.items()] + [key_for(9)])
            assert store.verify().ok
            with pytest.raises(StoreWriteError, match="read-only"):
                store.verify(repair=True)
            store.delete(key_for(1, 4))  # leaves the host tier; the disk keeps it
            assert store.tier_of(key_for(1, 4)) == "disk"
        with TieredStore(folder, StoreBudgets(host_bytes=0), options=options) as disk_only:
            assert not disk_only.put(key_for(11), make_entry(11))  # no tier holds it
            assert disk_only.get(key_for(2, 300)) is not None
    assert len(_read_only_warnings(caplog)) == 2  # once per store opened, not once per skipped write


def test_read_only_option_serves_hits_and_leaves_the_folder_untouched(tmp_path, caplog):
    folder = tmp_path / "store"
    _fill(folder)
    before = (_digest(folder), sorted(p.name for p in folder.rglob("*") if p.suffix == ".val"))
    _serves_and_skips_writes(folder, StoreOptions(disk_min_file_bytes=16 * 1024, read_only=True), caplog)
    assert (_digest(folder), sorted(p.name for p in folder.rglob("*") if p.suffix == ".val")) == before
    with TieredStore(folder, options=OPTIONS) as store:  # still a healthy writable store afterwards
        assert not store.read_only and len(store.keys()) == len(SEEDS) and key_for(1, 4) in store


def test_read_only_mount_is_detected_and_served(tmp_path, caplog):
    source = tmp_path / "source"
    _fill(source / "store")
    with mounted(tmp_path / "ro", read_only_of=source) as mount:
        folder = mount / "store"
        assert is_read_only_mount(folder)
        _serves_and_skips_writes(folder, OPTIONS, caplog)
        assert "not writable" in _read_only_warnings(caplog)[0]


def test_open_store_opens_an_existing_read_only_folder_and_explains_a_missing_one(tmp_path):
    source = tmp_path / "source"
    _fill(source / "store")
    with mounted(tmp_path / "ro", read_only_of=source) as mount:
        store = open_store(mount / "store", torch.device("cpu"))
        try:
            assert store.read_only and store.get(key_for(2, 300)) is not None
        finally:
            store.close()
        with pytest.raises(StoreConfigError, match="cannot create the store folder .*Read-only file system"):
            open_store(mount / "missing", torch.device("cpu"))


def test_read_only_store_without_an_index_is_empty(tmp_path):
    (tmp_path / "empty").mkdir()
    with TieredStore(tmp_path / "empty", options=StoreOptions(read_only=True)) as store:
        assert store.keys() == [] and store.get(key_for(1)) is None and store.stats().tiers["disk"].entries == 0
    assert list((tmp_path / "empty").iterdir()) == []
    with pytest.raises(ValueError, match="does not exist"):
        TieredStore(tmp_path / "nowhere", options=StoreOptions(read_only=True))
    with pytest.raises(ValueError, match="read_only must be a bool"):
        StoreOptions(read_only="yes")
