"""Pinning: reference counts (plain Python), eviction skips pinned entries, overshoot is bounded in time."""

import logging

import pytest
from storage_testutil import key_for, make_entry

from fusionrag_llm.storage import PinTable, StoreBudgets, TieredStore, TierLedger

ENTRY_BYTES = make_entry(0).nbytes


def test_pin_table_counts_holders():
    pins = PinTable()
    assert pins.pin("a") == 1 and pins.pin("a") == 2 and pins.pin("b") == 1 and len(pins) == 2
    assert pins.unpin("a") == 1 and pins.is_pinned("a")
    assert pins.unpin("a") == 0 and "a" not in pins and pins.count("a") == 0
    with pytest.raises(ValueError, match="not pinned"):
        pins.unpin("a")


def test_ledger_never_picks_a_pinned_victim():
    ledger = TierLedger("host", budget_bytes=100)
    ledger.add("a", 50)
    ledger.add("b", 50)
    heat = {"a": 1.0, "b": 2.0}.get
    assert ledger.victims(50, heat, pinned={"a"}.__contains__) == ["b"]
    assert ledger.victims(60, heat, pinned={"a"}.__contains__) is None
    ledger.add("c", 30, over_budget=True)
    assert ledger.overshoot_bytes == 30


def test_a_pinned_entry_survives_eviction_pressure_and_goes_after_unpin(tmp_path):
    budgets = StoreBudgets(host_bytes=2 * ENTRY_BYTES, disk_bytes=2**24)
    with TieredStore(tmp_path / "s", budgets) as store:
        store.put(key_for(0), make_entry(0))
        held, tier = store.get(key_for(0), copy=False, pin=True)
        assert tier == "host" and store.pin_count(key_for(0)) == 1
        for seed in range(1, 8):  # hotter entries than the pinned one
            store.put(key_for(seed), make_entry(seed))
            store.get(key_for(seed))
            store.get(key_for(seed))
        assert store.tier_of(key_for(0)) == "host" and held.bitwise_equal(make_entry(0))
        assert store.unpin(key_for(0)) == 0
        store.put(key_for(8), make_entry(8))
        store.get(key_for(8))
        store.get(key_for(8))
        assert store.tier_of(key_for(0)) == "disk"  # evicted once unpinned


def test_pinned_block_and_overshoot_in_a_memory_only_store(caplog):
    with TieredStore(None, StoreBudgets(host_bytes=2 * ENTRY_BYTES)) as store:
        for seed in (0, 1):
            store.put(key_for(seed), make_entry(seed))
        with store.pinned([key_for(0), key_for(1), key_for(9)]) as entries:
            assert set(entries) == {key_for(0), key_for(1)} and store.stats().pinned == 2
            with caplog.at_level(logging.WARNING):
                assert store.put(key_for(2), make_entry(2))  # no other home: kept over budget
            stats = store.stats()
            assert stats.pin_overshoots == 1 and stats.tiers["host"].bytes == 3 * ENTRY_BYTES
            assert "over its budget" in caplog.text and "pinned" in caplog.text
            assert all(store.tier_of(key_for(s)) == "host" for s in range(3))
        stats = store.stats()  # unpinned: the overshoot is shed
        assert stats.pinned == 0 and stats.tiers["host"].bytes <= 2 * ENTRY_BYTES


def test_pinned_entries_are_not_promoted():
    from fusionrag_llm.storage import HostTier

    upper, lower = HostTier(4 * ENTRY_BYTES, name="upper"), HostTier(4 * ENTRY_BYTES, name="lower")
    with TieredStore.from_tiers([upper, lower]) as store:
        store.put(key_for(0), make_entry(0))
        store.pin(key_for(0))
        assert store.get(key_for(0))[1] == "lower" and store.tier_of(key_for(0)) == "lower"
        store.unpin(key_for(0))
        store.get(key_for(0))
        assert store.tier_of(key_for(0)) == "upper"
