"""Single tiers: memory and disk round trips, disk corruption handling, disk budget."""

import logging
import sqlite3

import pytest
import torch
from storage_testutil import key_for, make_entry
from test_storage_safety_helpers import stored_file

from fusionrag_llm.storage import DeviceTier, DiskTier, HostTier, RawCodec

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SMALL = 4  # tokens: a few hundred bytes, stored inside the SQLite index
LARGE = 300  # tokens: tens of KB, stored as a file (min_file_bytes below)


@pytest.mark.parametrize("dtype", DTYPES)
def test_host_tier_round_trip_and_budget(dtype):
    entry = make_entry(1, dtype=dtype)
    tier = HostTier(budget_bytes=entry.nbytes * 2)
    tier.put("a", entry.copy_to())
    assert tier.get("a").bitwise_equal(entry)
    tier.put("b", entry.copy_to())
    with pytest.raises(ValueError, match="budget"):
        tier.put("c", entry.copy_to())
    assert tier.used_bytes == 2 * entry.nbytes <= tier.budget_bytes
    assert tier.pop("a").bitwise_equal(entry) and "a" not in tier


def test_device_tier_refuses_cpu():
    with pytest.raises(ValueError, match="HostTier"):
        DeviceTier(1024, "cpu")


@pytest.fixture
def disk(tmp_path):
    tier = DiskTier(tmp_path / "disk", budget_bytes=2**24, min_file_bytes=16 * 1024)
    yield tier
    tier.close()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [SMALL, LARGE])
def test_disk_round_trip_is_bit_identical(disk, dtype, num_tokens):
    entry = make_entry(2, num_tokens=num_tokens, dtype=dtype)
    assert disk.put(key_for(2, num_tokens), entry)
    assert disk.get(key_for(2, num_tokens)).bitwise_equal(entry)


def test_small_and_large_entries_use_db_and_files(disk):
    disk.put(key_for(1, SMALL), make_entry(1, SMALL))
    disk.put(key_for(2, LARGE), make_entry(2, LARGE))
    assert stored_file(disk.directory, key_for(1, SMALL)) is None
    assert stored_file(disk.directory, key_for(2, LARGE)) is not None


def _damage_file(disk: DiskTier, key: str, how: str) -> None:
    path = stored_file(disk.directory, key)
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0xFF
    elif how == "truncate":
        data = data[: len(data) // 3]
    elif how == "magic":
        data[:4] = b"JUNK"
    path.write_bytes(bytes(data))


def _damage_db_value(disk: DiskTier, key: str, how: str) -> None:
    with sqlite3.connect(disk.directory / "cache.db") as con:
        (value,) = con.execute("SELECT value FROM entries WHERE key = ?", (key,)).fetchone()
        data = bytearray(value)
        if how == "flip":
            data[len(data) // 2] ^= 0xFF
        elif how == "truncate":
            data = data[: len(data) // 3]
        elif how == "magic":
            data[:4] = b"JUNK"
        con.execute("UPDATE entries SET value = ? WHERE key = ?", (sqlite3.Binary(bytes(data)), key))


@pytest.mark.parametrize("how", ["flip", "truncate", "magic"])
@pytest.mark.parametrize("num_tokens", [SMALL, LARGE])
def test_corrupt_entry_is_dropped_with_warning_and_others_survive(disk, caplog, how, num_tokens):
    seeds = [10, 11, 12]
    for seed in seeds:
        disk.put(key_for(seed, num_tokens), make_entry(seed, num_tokens))
    bad = key_for(11, num_tokens)
    damage = _damage_db_value if num_tokens == SMALL else _damage_file
    damage(disk, bad, how)
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage"):
        assert disk.get(bad) is None
    assert any("corrupt" in r.getMessage() and bad in r.getMessage() for r in caplog.records)
    assert bad not in disk and disk.corrupt_count == 1
    for seed in (10, 12):
        assert disk.get(key_for(seed, num_tokens)).bitwise_equal(make_entry(seed, num_tokens))


def test_verify_lists_and_removes_only_corrupt_entries(disk, caplog):
    for seed in range(6):
        disk.put(key_for(seed, LARGE if seed % 2 else SMALL), make_entry(seed, LARGE if seed % 2 else SMALL))
    _damage_file(disk, key_for(1, LARGE), "truncate")
    _damage_db_value(disk, key_for(2, SMALL), "flip")
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage"):
        report = disk.verify()
    assert report.checked == 6 and not report.ok
    assert sorted(report.corrupt) == sorted([key_for(1, LARGE), key_for(2, SMALL)])
    assert len(disk) == 4
    assert disk.verify().ok


def test_missing_file_is_a_miss(disk):
    disk.put(key_for(3, LARGE), make_entry(3, LARGE))
    stored_file(disk.directory, key_for(3, LARGE)).unlink()
    assert disk.get(key_for(3, LARGE)) is None


def test_disk_budget_is_never_exceeded(tmp_path):
    entry_bytes = len(RawCodec().encode(make_entry(0, LARGE)))
    budget = 200 * 1024
    tier = DiskTier(tmp_path / "d", budget_bytes=budget, min_file_bytes=1024)
    for seed in range(20):
        assert tier.put(key_for(seed, LARGE), make_entry(seed, LARGE))
        assert tier.used_bytes <= budget
    assert 0 < len(tier) < 20
    assert len(tier) * entry_bytes <= budget
    assert key_for(19, LARGE) in tier  # the newest survives, the least recently used went first
    assert key_for(0, LARGE) not in tier
    tier.close()


def test_entry_larger_than_disk_budget_is_refused(tmp_path, caplog):
    tier = DiskTier(tmp_path / "d", budget_bytes=4096)
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage"):
        assert not tier.put(key_for(1, LARGE), make_entry(1, LARGE))
    assert "exceeds the disk budget" in caplog.text
    assert len(tier) == 0
    tier.close()


def test_disk_eviction_spares_recently_read_entries(tmp_path):
    entry_bytes = make_entry(0, LARGE).nbytes
    tier = DiskTier(tmp_path / "d", budget_bytes=32 * 1024 + int(2.5 * entry_bytes), min_file_bytes=1024)
    tier.put(key_for(0, LARGE), make_entry(0, LARGE))
    tier.put(key_for(1, LARGE), make_entry(1, LARGE))
    assert tier.get(key_for(0, LARGE)) is not None  # now 0 is more recent than 1
    tier.put(key_for(2, LARGE), make_entry(2, LARGE))
    assert key_for(0, LARGE) in tier and key_for(2, LARGE) in tier
    assert key_for(1, LARGE) not in tier and tier.evictions == 1
    tier.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_a_pinned_host_tier_needs_cuda_and_a_store_for_cuda_pins_only_when_it_has_it():
    with pytest.raises(ValueError, match="needs CUDA"):
        HostTier(1024, pin=True)
    from fusionrag_llm.storage import StoreBudgets, StoreOptions
    from fusionrag_llm.storage.tier_list import default_tiers

    tiers = default_tiers(None, StoreBudgets(device_bytes=0), "cuda", StoreOptions())
    assert [type(t).__name__ for t in tiers] == ["HostTier"] and not tiers[0].pin
