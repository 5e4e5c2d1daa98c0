"""Device tier on CUDA: round trips, promotion from host and disk, budget, demotion."""

import pytest
import torch
from storage_testutil import key_for, make_entry

from fusionrag_llm.storage import DeviceTier, PrefetchLoader, StoreBudgets, TieredStore

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
ENTRY_BYTES = make_entry(0).nbytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_device_tier_round_trip(dtype):
    entry = make_entry(1, dtype=dtype)
    tier = DeviceTier(4 * entry.nbytes)
    held = tier.put("k", entry.copy_to())
    assert held.device.type == "cuda" and tier.get("k").bitwise_equal(entry)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_store_promotes_to_device_and_round_trips(tmp_path, dtype):
    entry = make_entry(2, dtype=dtype)
    with TieredStore(tmp_path / "s", device="cuda") as store:
        assert store.tier_names == ["device", "host", "disk"]
        store.put(key_for(2), entry)
        got, tier = store.get(key_for(2))
        assert tier == "host" and got.device.type == "cuda" and got.bitwise_equal(entry)
        got, tier = store.get(key_for(2))
        assert tier == "device" and got.bitwise_equal(entry)
    with TieredStore(tmp_path / "s", device="cuda") as store:
        got, tier = store.get(key_for(2))
        assert tier == "disk" and store.tier_of(key_for(2)) == "device" and got.bitwise_equal(entry)


def test_device_budget_and_demotion_to_host(tmp_path):
    budgets = StoreBudgets(device_bytes=2 * ENTRY_BYTES, host_bytes=4 * ENTRY_BYTES)
    with TieredStore(tmp_path / "s", budgets, device="cuda") as store:
        for seed in range(6):
            store.put(key_for(seed), make_entry(seed))
            for _ in range(seed + 1):
                store.get(key_for(seed))
            stats = store.stats()
            assert stats.tiers["device"].bytes <= 2 * ENTRY_BYTES
            assert stats.tiers["host"].bytes <= 4 * ENTRY_BYTES
        assert {store.tier_of(key_for(s)) for s in (4, 5)} == {"device"}  # the hottest
        assert store.stats().demotions >= 1
        for seed in range(6):
            assert store.get(key_for(seed))[0].bitwise_equal(make_entry(seed))


def test_loader_prefetches_onto_the_device(tmp_path):
    with TieredStore(tmp_path / "s") as store:
        store.put(key_for(7), make_entry(7))
    with TieredStore(tmp_path / "s", device="cuda") as store:
        loader = PrefetchLoader(store)
        loader.submit("r", [key_for(7)])
        result = loader.wait("r")
        loader.close()
        assert result.entries[key_for(7)].device.type == "cuda"
        assert store.tier_of(key_for(7)) == "device"


@pytest.mark.parametrize("storage_dtype", [None, torch.float16])
def test_a_gpu_entry_is_stored_on_the_device_tier_without_a_trip_to_the_host(storage_dtype):
    entry = make_entry(5, dtype=torch.float32).copy_to("cuda")
    store = TieredStore(None, StoreBudgets(device_bytes=4 * ENTRY_BYTES, host_bytes=0), "cuda",
                        storage_dtype=storage_dtype)  # fmt: skip
    stored = store.stored_form(entry)
    assert stored.device.type == "cuda" and stored.keys.data_ptr() != entry.keys.data_ptr()
    assert stored.dtype == (storage_dtype or torch.float32)
    store.put(key_for(5), entry)
    got, tier = store.get(key_for(5))
    assert tier == "device" and got.bitwise_equal(stored)
