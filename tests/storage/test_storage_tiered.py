"""TieredStore: round trips through each tier, placement by heat, budgets, copies, stats."""

import logging

import pytest
import torch
from storage_testutil import key_for, make_entry

from fusionrag_llm.storage import HostTier, StoreBudgets, StoreOptions, TieredStore

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ENTRY_BYTES = make_entry(0).nbytes  # 512 bytes with the default test shape


@pytest.fixture
def store(tmp_path):
    with TieredStore(tmp_path / "store", StoreBudgets(host_bytes=5 * ENTRY_BYTES, disk_bytes=2**24)) as s:
        yield s


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_host_then_disk(tmp_path, dtype):
    entry = make_entry(1, dtype=dtype)
    with TieredStore(tmp_path / "s") as store:
        assert store.put(key_for(1), entry)
        got, tier = store.get(key_for(1), expect_token_ids=entry.token_ids)
        assert tier == "host" and got.bitwise_equal(entry)
    with TieredStore(tmp_path / "s") as reopened:  # a fresh process view: memory tiers empty
        got, tier = reopened.get(key_for(1))
        assert tier == "disk" and got.bitwise_equal(entry)
        got, tier = reopened.get(key_for(1))
        assert tier == "host" and got.bitwise_equal(entry)  # promoted on access


@pytest.mark.parametrize("dtype", DTYPES)
def test_memory_only_store_round_trip(dtype):
    entry = make_entry(2, dtype=dtype)
    with TieredStore(None) as store:
        assert store.tier_names == ["host"]
        store.put(key_for(2), entry)
        got, tier = store.get(key_for(2))
        assert tier == "host" and got.bitwise_equal(entry)


def test_storage_dtype_applies_to_every_tier(tmp_path):
    entry = make_entry(3, dtype=torch.float32)
    with TieredStore(tmp_path / "s", storage_dtype=torch.float16) as store:
        store.put(key_for(3), entry)
        got, _ = store.get(key_for(3))
        assert got.dtype == torch.float16 and torch.equal(got.keys, entry.keys.half())
    with TieredStore(tmp_path / "s") as reopened:
        got, tier = reopened.get(key_for(3))
        assert tier == "disk" and got.dtype == torch.float16 and torch.equal(got.values, entry.values.half())


def test_default_get_returns_copies_that_cannot_corrupt_the_store(store):
    entry = make_entry(4)
    store.put(key_for(4), entry)
    entry.keys.zero_()  # the caller's own tensors after put: must not reach the store
    first, _ = store.get(key_for(4))
    first.values.zero_()
    second, tier = store.get(key_for(4))
    assert tier == "host" and second.bitwise_equal(make_entry(4))


def test_zero_copy_get_shares_the_tier_tensors(store):
    store.put(key_for(5), make_entry(5))
    a, _ = store.get(key_for(5), copy=False)
    b, _ = store.get(key_for(5), copy=False)
    assert a.keys.data_ptr() == b.keys.data_ptr()
    c, _ = store.get(key_for(5))
    assert c.keys.data_ptr() != a.keys.data_ptr()


def test_token_mismatch_is_a_miss_with_warning(store, caplog):
    entry = make_entry(6)
    store.put(key_for(6), entry)
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage"):
        assert store.get(key_for(6), expect_token_ids=[1, 2, 3, 4]) is None
    assert "differ" in caplog.text
    stats = store.stats()
    assert stats.token_mismatches == 1 and stats.misses == 1
    assert store.get(key_for(6), expect_token_ids=entry.token_ids) is not None


def test_mapping_api(store):
    keys = [key_for(i) for i in range(3)]
    for i, key in enumerate(keys):
        store.put(key, make_entry(i))
    assert all(key in store for key in keys) and key_for(99) not in store
    assert sorted(store.keys()) == sorted(keys)
    assert store.delete(keys[0]) and keys[0] not in store and not store.delete(keys[0])
    assert store.get(keys[0]) is None
    store.clear()
    assert store.keys() == [] and store.get(keys[1]) is None
    with pytest.raises(ValueError, match="64 lowercase hex"):
        store.put("not-a-key", make_entry(0))


def test_closed_store_refuses_use(tmp_path):
    store = TieredStore(tmp_path / "s")
    store.close()
    store.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        store.get(key_for(0))


def test_budgets_hold_and_disk_keeps_everything(store):
    budget = store.stats().tiers["host"].budget_bytes
    for seed in range(30):
        store.put(key_for(seed), make_entry(seed))
        store.get(key_for(seed // 2))
        assert store.stats().tiers["host"].bytes <= budget
    stats = store.stats()
    assert stats.tiers["host"].entries == 5
    assert stats.tiers["disk"].entries == 30  # host pressure never deletes from the last tier
    for seed in range(30):
        got, _ = store.get(key_for(seed))
        assert got.bitwise_equal(make_entry(seed))


def test_hot_entries_stay_in_memory(store):
    hot = [key_for(100), key_for(101)]
    for seed, key in zip((100, 101), hot):
        store.put(key, make_entry(seed))
    for _ in range(5):
        for key in hot:
            store.get(key)
    for seed in range(40):  # a stream of one-off entries
        store.put(key_for(seed), make_entry(seed))
        store.get(key_for(seed))
    assert [store.tier_of(key) for key in hot] == ["host", "host"]
    assert store.tier_of(key_for(0)) == "disk"


def test_one_off_entries_never_displace_hotter_ones(store):
    hot = [key_for(seed) for seed in range(5)]  # fills the host tier exactly
    for seed, key in enumerate(hot):
        store.put(key, make_entry(seed))
        store.get(key)
        store.get(key)
    for seed in range(10, 20):
        store.put(key_for(seed), make_entry(seed))  # heat 1 < every resident's heat
        assert store.tier_of(key_for(seed)) == "disk"
    assert all(store.tier_of(key) == "host" for key in hot)
    assert store.stats().tiers["host"].entries == 5


def test_memory_only_store_drops_coldest_when_full():
    with TieredStore(None, StoreBudgets(host_bytes=3 * ENTRY_BYTES)) as store:
        for _ in range(3):
            store.put(key_for(0), make_entry(0))  # hot
        for seed in range(1, 6):
            assert store.put(key_for(seed), make_entry(seed))  # last tier: always admitted
        assert store.stats().tiers["host"].bytes <= 3 * ENTRY_BYTES
        assert set(store.keys()) == {key_for(0), key_for(4), key_for(5)}


def _two_level_store(directory=None, upper=2, lower=3):
    tiers = [HostTier(upper * ENTRY_BYTES, name="upper"), HostTier(lower * ENTRY_BYTES, name="lower")]
    from fusionrag_llm.storage import DiskTier

    disk = DiskTier(directory, 2**24) if directory is not None else None
    return TieredStore.from_tiers(tiers, disk)


def test_promotion_and_demotion_between_memory_tiers():
    store = _two_level_store(upper=2, lower=3)
    for seed in range(3):
        store.put(key_for(seed), make_entry(seed))
    assert {store.tier_of(key_for(s)) for s in range(3)} == {"lower"}
    for seed in (0, 1):
        _, tier = store.get(key_for(seed))
        assert tier == "lower"
        assert store.tier_of(key_for(seed)) == "upper"  # promoted
    for _ in range(3):
        store.get(key_for(2))  # now the hottest: takes the place of a colder upper entry
    assert store.tier_of(key_for(2)) == "upper"
    stats = store.stats()
    assert stats.demotions >= 1 and stats.promotions >= 3
    assert sorted(store.tier_of(key_for(s)) for s in range(3)) == ["lower", "upper", "upper"]
    for seed in range(3):  # nothing lost: demoted, not deleted, while the lower tier had room
        assert store.get(key_for(seed))[0].bitwise_equal(make_entry(seed))
    assert stats.tiers["upper"].bytes <= 2 * ENTRY_BYTES


def test_stats_count_hits_per_tier_misses_and_corruption(tmp_path):
    with TieredStore(tmp_path / "s") as store:
        store.put(key_for(1), make_entry(1))
        store.get(key_for(1))
        store.get(key_for(2))
    with TieredStore(tmp_path / "s") as store:
        store.get(key_for(1))
        store.get(key_for(1))
        stats = store.stats()
        assert stats.hits == {"host": 1, "disk": 1} and stats.misses == 0
        assert stats.tiers["disk"].entries == 1 and stats.tiers["host"].entries == 1
        assert stats.to_dict()["tiers"]["host"]["bytes"] == ENTRY_BYTES
        assert store.verify().checked == 1


def test_bad_settings_raise_value_error(tmp_path):
    with pytest.raises(ValueError, match="disk_bytes must be > 0"):
        TieredStore(tmp_path / "s", StoreBudgets(disk_bytes=0))
    with pytest.raises(ValueError, match="host_bytes > 0"):
        TieredStore(None, StoreBudgets(host_bytes=0))
    with pytest.raises(ValueError, match="storage_dtype"):
        TieredStore(None, storage_dtype="float16")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            TieredStore(None, device="cuda")
    with TieredStore(None, device="cpu") as store:
        assert store.tier_names == ["host"]  # no device tier on CPU


def test_options_copy_on_get_false(tmp_path):
    with TieredStore(None, options=StoreOptions(copy_on_get=False)) as store:
        store.put(key_for(1), make_entry(1))
        a, _ = store.get(key_for(1))
        b, _ = store.get(key_for(1))
        assert a.keys.data_ptr() == b.keys.data_ptr()


def test_entry_evicted_from_memory_is_written_back_when_disk_dropped_it(tmp_path):
    from fusionrag_llm.storage import DiskTier

    big = make_entry(0, num_tokens=300).nbytes
    disk = DiskTier(tmp_path / "d", budget_bytes=32 * 1024 + int(1.5 * big), min_file_bytes=1024)
    with TieredStore.from_tiers([HostTier(big)], disk) as store:
        store.put(key_for(0, 300), make_entry(0, 300))
        store.put(key_for(1, 300), make_entry(1, 300))  # disk has room for one: it drops entry 0
        assert store.tier_of(key_for(0, 300)) == "disk"  # ... so host's copy was written back
        assert store.tier_of(key_for(1, 300)) == "host"
        assert store.stats().disk_evictions >= 1
        for seed in (0, 1):
            assert store.get(key_for(seed, 300))[0].bitwise_equal(make_entry(seed, 300))


def test_threads_share_one_store(tmp_path):
    import threading

    errors = []
    budgets = StoreBudgets(host_bytes=6 * ENTRY_BYTES)
    with TieredStore(tmp_path / "s", budgets) as store:

        def work(worker):
            try:
                for i in range(60):
                    seed = (worker * 7 + i) % 20
                    if i % 3 == 0:
                        store.put(key_for(seed), make_entry(seed))
                    found = store.get(key_for(seed))
                    if found is not None and not found[0].bitwise_equal(make_entry(seed)):
                        errors.append(seed)
                    if store.stats().tiers["host"].bytes > budgets.host_bytes:
                        errors.append("budget")
            except Exception as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert store.stats().hits["host"] + store.stats().hits["disk"] > 0
