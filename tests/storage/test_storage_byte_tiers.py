"""Tiers as a list: a dict-backed byte tier between memory and disk, read through, promoted and demoted."""

from collections import OrderedDict

import pytest
from storage_testutil import key_for, make_entry

from fusionrag_llm.storage import ByteTier, CodedTier, DiskTier, HostTier, StoreOptions, TieredStore
from fusionrag_llm.storage.byte_tier import verify_values
from fusionrag_llm.storage.stats import TierStats

ENTRY_BYTES = make_entry(0).nbytes


class DictBytes:
    """A byte tier in a dict, least recently used out first: what a remote cache would be."""

    name = "dict"
    read_only = False

    def __init__(self, budget_bytes: int):
        self.budget_bytes, self.values = budget_bytes, OrderedDict()
        self.evictions = self.write_failures = self.corrupt_count = 0

    @property
    def used_bytes(self):
        return sum(len(v) for v in self.values.values())

    def __contains__(self, key):
        return key in self.values

    def __len__(self):
        return len(self.values)

    def keys(self):
        return list(self.values)

    def get(self, key):
        if key in self.values:
            self.values.move_to_end(key)
        return self.values.get(key)

    def put(self, key, data, *, persist=False):
        if len(data) > self.budget_bytes:
            return False
        self.values[key] = data
        while self.used_bytes > self.budget_bytes:
            self.values.popitem(last=False)
            self.evictions += 1
        return True

    def delete(self, key):
        return self.values.pop(key, None) is not None

    def discard(self, key, data):
        return self.values.get(key) == data and self.delete(key)

    def verify(self, classify, repair=False):
        return verify_values(self, classify, repair)

    def stats(self):
        return TierStats(self.name, len(self), self.used_bytes, self.budget_bytes)

    def clear(self):
        self.values.clear()

    def close(self):
        pass


def encoded_size():
    return len(CodedTier(DictBytes(2**20)).encode(key_for(0), make_entry(0)))


@pytest.fixture
def stack(tmp_path):
    host, middle = HostTier(2 * ENTRY_BYTES), CodedTier(DictBytes(2 * encoded_size()))
    with TieredStore.from_tiers([host, middle, DiskTier(tmp_path / "d", 2**24)]) as store:
        yield store, middle.bytes


def test_dict_tier_has_the_byte_tier_shape():
    assert isinstance(DictBytes(1), ByteTier)


def test_puts_go_home_and_to_memory_and_evictions_demote_into_the_byte_tier(stack):
    store, middle = stack
    assert store.tier_names == ["host", "dict", "disk"] and store.codec_id == "raw"
    for seed in range(3):
        store.put(key_for(seed), make_entry(seed))
    assert all(store.tier_of(key_for(s)) in ("host", "dict") for s in range(3))
    assert key_for(0) in middle  # evicted from host (coldest), demoted to the dict tier, not dropped
    assert all(key_for(s) in store.keys() for s in range(3)) and store.stats().demotions + store.stats().evictions >= 1


def test_reads_go_through_byte_tiers_and_promote(stack, tmp_path):
    store, middle = stack
    store.put(key_for(1), make_entry(1))
    store.close()
    host, middle = HostTier(2 * ENTRY_BYTES), CodedTier(DictBytes(2 * encoded_size()))
    with TieredStore.from_tiers([host, middle, DiskTier(tmp_path / "d", 2**24)]) as store:
        got, tier = store.get(key_for(1))
        assert tier == "disk" and got.bitwise_equal(make_entry(1))
        assert key_for(1) in middle.bytes and key_for(1) in host  # copied up into both
        host.clear()
        got, tier = store.get(key_for(1))
        assert tier == "dict" and got.bitwise_equal(make_entry(1))
        assert store.stats().hits == {"host": 0, "dict": 1, "disk": 1}


def test_a_corrupt_value_in_a_byte_tier_is_discarded_and_the_home_serves(stack):
    store, middle = stack
    store.put(key_for(2), make_entry(2))
    good = store._bytes[-1].bytes.get(key_for(2))
    middle.values[key_for(2)] = good[:-1] + bytes([good[-1] ^ 1])
    store._memory[0].clear()
    got, tier = store.get(key_for(2))
    assert tier == "disk" and got.bitwise_equal(make_entry(2)) and store.stats().corrupt == 1
    assert middle.values[key_for(2)] == good  # discarded, then refilled from the home
    report = store.verify()
    assert report.ok and report.checked == 2


def test_tier_lists_are_checked(tmp_path):
    host, middle = HostTier(ENTRY_BYTES), CodedTier(DictBytes(2**20))
    with pytest.raises(ValueError, match="memory tiers must come before byte tiers"):
        TieredStore.from_tiers([middle, host])
    with pytest.raises(ValueError, match="MemoryTier or a CodedTier"):
        TieredStore.from_tiers([host, object()])
    with pytest.raises(ValueError, match="ByteTier shape"):
        CodedTier(object())
    with pytest.raises(ValueError, match="unique"):
        TieredStore.from_tiers([host, HostTier(ENTRY_BYTES)])
    memory_only = TieredStore.from_tiers([host], options=StoreOptions(codec="raw"))
    assert memory_only.codec_id == "raw" and memory_only.directory is None
