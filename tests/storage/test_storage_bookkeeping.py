"""Heat and budget bookkeeping: plain Python, no tensors."""

import pytest

from fusionrag_llm.storage import HeatTracker, StoreBudgets, StoreOptions, TierLedger


def test_heat_grows_with_accesses_and_decays_with_time():
    heat = HeatTracker(half_life=4)
    for _ in range(3):
        heat.touch("hot")
    heat.touch("cold")
    assert heat.heat("hot") > heat.heat("cold") > 0
    before = heat.heat("hot")
    for i in range(4):
        heat.touch(f"other{i}")
    assert heat.heat("hot") == pytest.approx(before / 2)
    assert heat.heat("never") == 0.0


def test_recent_single_access_beats_old_single_access():
    heat = HeatTracker(half_life=10)
    heat.touch("old")
    for i in range(5):
        heat.touch(f"x{i}")
    heat.touch("new")
    assert heat.heat("new") > heat.heat("old")


def test_heat_tracker_prunes_cold_keys():
    heat = HeatTracker(half_life=1, prune_every=50)
    for i in range(200):
        heat.touch(f"k{i}")
    assert len(heat) < 60  # only keys touched in the last ~10 half-lives survive
    assert heat.heat("k199") == pytest.approx(1.0)


def test_ledger_never_passes_budget():
    ledger = TierLedger("host", 100)
    ledger.add("a", 60)
    with pytest.raises(ValueError, match="budget"):
        ledger.add("b", 41)
    ledger.add("b", 40)
    assert ledger.used_bytes == 100 and ledger.free_bytes == 0
    with pytest.raises(ValueError, match="already"):
        ledger.add("a", 0)
    assert ledger.remove("a") == 60 and ledger.remove("a") == 0
    assert ledger.used_bytes == 40


def test_victims_are_coldest_first_and_respect_colder_than():
    ledger = TierLedger("device", 100)
    heat = {"a": 3.0, "b": 1.0, "c": 2.0}
    for key in heat:
        ledger.add(key, 30)
    assert ledger.victims(10, heat.get) == []
    assert ledger.victims(40, heat.get) == ["b"]
    assert ledger.victims(70, heat.get) == ["b", "c"]
    assert ledger.victims(70, heat.get, colder_than=2.5) == ["b", "c"]
    assert ledger.victims(70, heat.get, colder_than=1.5) is None
    assert ledger.victims(101, heat.get) is None


def test_settings_validate_with_clear_messages():
    assert StoreBudgets().host_bytes == 2 * 2**30
    with pytest.raises(ValueError, match=r"StoreBudgets.host_bytes must be an int >= 0"):
        StoreBudgets(host_bytes=-1)
    with pytest.raises(ValueError, match="disk_bytes"):
        StoreBudgets(disk_bytes=1.5)
    with pytest.raises(ValueError, match="heat_half_life"):
        StoreOptions(heat_half_life=0)
    with pytest.raises(ValueError, match="budget"):
        TierLedger("x", -5)
