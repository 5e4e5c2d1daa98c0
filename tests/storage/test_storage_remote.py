"""The remote tier on a real redis-server: sharing, corruption, budgets by heat, outages, settings.

Every store here authenticates the remote tier's values with `SECRET` unless a test says otherwise;
the values' MAC has tests of its own in test_storage_remote_auth.py."""

import logging

import pytest
from storage_testutil import key_for, make_entry

from fusionrag_llm.storage import StoreBudgets, StoreOptions, TieredStore, remote_key_prefix
from fusionrag_llm.storage.redis_bytes import check_remote_url

BARE = "fusionrag:kv:"  # the default prefix: a trusted network's keys
SECRET = "a secret only these tests know"
PREFIX = remote_key_prefix(BARE, SECRET)  # the keys of stores with SECRET


def open_store(folder, url, **options) -> TieredStore:
    budgets = StoreBudgets(host_bytes=0, disk_bytes=2**26, remote_bytes=2**26)
    auth = {} if "remote_trusted" in options else {"remote_secret": SECRET}
    return TieredStore(folder, budgets, options=StoreOptions(remote_url=url, **auth, **options))


def test_what_one_store_puts_another_on_its_own_folder_loads_from_the_remote(tmp_path, redis_server):
    with open_store(tmp_path / "a", redis_server.url) as first, open_store(tmp_path / "b", redis_server.url) as second:
        assert first.tier_names == ["disk", "remote"]
        assert first.put(key_for(1), make_entry(1))
        entry, tier = second.get(key_for(1), expect_token_ids=make_entry(1).token_ids)
        assert tier == "remote" and entry.bitwise_equal(make_entry(1))
        assert second.tier_of(key_for(1)) == "disk"  # copied into the local disk on the way up
        assert second.get(key_for(1))[1] == "disk"
    server = redis_server.client()
    assert server.hlen(PREFIX + "size") == 1 and server.exists(PREFIX + "e:" + key_for(1))
    assert int(server.get(PREFIX + "used")) == len(server.get(PREFIX + "e:" + key_for(1)))


@pytest.mark.parametrize(
    ("auth", "caught_by"),
    [({}, "not authenticated: its MAC does not verify"), ({"remote_trusted": True}, "corrupt (checksum mismatch")],
)
def test_a_corrupt_remote_entry_is_detected_dropped_and_a_miss(tmp_path, redis_server, caplog, auth, caught_by):
    """With a secret the MAC catches a flipped bit first; on a trusted network the frame's checksum does."""
    server = redis_server.client()
    with open_store(tmp_path / "a", redis_server.url, **auth) as first:
        first.put(key_for(2), make_entry(2))
    prefix = BARE if auth else PREFIX
    value_key = prefix + "e:" + key_for(2)
    data = bytearray(server.get(value_key))
    data[-5] ^= 0xFF  # one flipped bit in the payload
    server.set(value_key, bytes(data))
    with open_store(tmp_path / "b", redis_server.url, **auth) as second, caplog.at_level(logging.WARNING):
        assert second.get(key_for(2)) is None
        assert second.stats().corrupt == 1 and caught_by in caplog.text
        assert not server.exists(value_key) and server.hlen(prefix + "size") == 0
        assert int(server.get(prefix + "used")) == 0
        assert second.put(key_for(2), make_entry(2))  # recomputed and shared again
    with open_store(tmp_path / "c", redis_server.url, **auth) as third:
        assert third.get(key_for(2))[0].bitwise_equal(make_entry(2))


def test_the_budget_evicts_by_heat_shared_by_two_stores(redis_server):
    from fusionrag_llm.storage.redis_bytes import RedisBytes

    data = {seed: bytes([seed]) * 1000 for seed in range(5)}
    first = RedisBytes(redis_server.url, budget_bytes=3500)
    second = RedisBytes(redis_server.url, budget_bytes=3500)
    for seed in range(3):
        assert first.put(key_for(seed), data[seed])
    for _ in range(3):  # entry 0 hot through the other client
        assert second.get(key_for(0)) == data[0]
    for seed in (1, 2):  # later, once each: least-recently-used would evict entry 0
        assert first.get(key_for(seed)) == data[seed]
    assert first.put(key_for(3), data[3]) and first.evictions == 1
    assert set(second.keys()) == {key_for(0), key_for(2), key_for(3)}
    assert second.put(key_for(4), data[4])  # entry 3, never read, is the coldest now
    assert set(first.keys()) == {key_for(0), key_for(2), key_for(4)} and first.used_bytes == 3000
    assert not first.put(key_for(1), b"x" * 4000)  # over the budget by itself: refused
    first.close()
    second.close()


def test_killing_the_server_mid_run_degrades_to_the_local_tiers(tmp_path, redis_server, caplog):
    with open_store(tmp_path / "a", redis_server.url, remote_retry_s=60.0) as store:
        for seed in range(3):
            store.put(key_for(seed), make_entry(seed))
        redis_server.kill()
        with caplog.at_level(logging.WARNING):
            for seed in range(3, 6):  # written locally while the remote is down
                assert store.put(key_for(seed), make_entry(seed))
            for seed in range(6):
                assert store.get(key_for(seed))[0].bitwise_equal(make_entry(seed))
            assert store.get(key_for(99)) is None  # a miss, not an error
        assert caplog.text.count("unreachable") == 1  # once per back-off interval
        stats = store.stats()
        assert stats.disk_write_failures == 3 and stats.tiers["disk"].entries == 6


def test_an_unreachable_url_at_open_logs_and_falls_back(tmp_path, caplog):
    pytest.importorskip("redis", reason="the remote KV tier needs the redis client")
    from redis_server import free_port

    with caplog.at_level(logging.WARNING):
        store = open_store(tmp_path / "a", f"redis://127.0.0.1:{free_port()}/0", remote_timeout_s=0.2)
    assert "unreachable" in caplog.text and "using local tiers only" in caplog.text
    with store:
        assert store.put(key_for(1), make_entry(1))
        assert store.get(key_for(1))[1] == "disk" and store.stats().tiers["remote"].entries == 0


def test_read_only_options_are_respected_by_the_remote(tmp_path, redis_server):
    with open_store(tmp_path / "a", redis_server.url) as writer:
        writer.put(key_for(1), make_entry(1))
    with open_store(tmp_path / "a", redis_server.url, read_only=True) as reader:
        assert reader.get(key_for(1)) is not None
        assert not reader.put(key_for(2), make_entry(2))  # no tier takes it (this store has no memory tier)
    assert not redis_server.client().exists(PREFIX + "e:" + key_for(2))


def test_keys_live_under_the_prefix_and_clear_leaves_other_data(tmp_path, redis_server):
    server = redis_server.client()
    server.set("someone:else", b"1")
    with open_store(tmp_path / "a", redis_server.url, remote_prefix="team:") as store:
        store.put(key_for(1), make_entry(1))
        assert server.exists(remote_key_prefix("team:", SECRET) + "e:" + key_for(1)) and not server.exists(PREFIX + "size")
        store.clear()
    assert server.keys("team:*") == [] and server.get("someone:else") == b"1"


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "127.0.0.1:6379", "redis://", 6379])
def test_non_redis_urls_are_refused_naming_what_is_allowed(url):
    with pytest.raises(ValueError, match="redis://, rediss:// or unix://"):
        StoreOptions(remote_url=url, remote_secret=SECRET)
    with pytest.raises(ValueError, match="redis://"):
        check_remote_url(url)


def test_remote_settings_are_checked():
    bad_settings = ({"remote_timeout_s": 0}, {"remote_retry_s": -1}, {"remote_prefix": ""},
                    {"shared_heat_half_life_s": 0}, {"remote_trusted": 1})  # fmt: skip
    for bad in bad_settings:
        with pytest.raises(ValueError, match=next(iter(bad))):
            StoreOptions(**bad)
    with pytest.raises(ValueError, match="remote_bytes"):
        StoreBudgets(remote_bytes=-1)


def test_a_value_the_server_dropped_by_itself_is_a_miss_and_its_bookkeeping_goes(redis_server):
    from fusionrag_llm.storage.redis_bytes import RedisBytes

    tier = RedisBytes(redis_server.url, budget_bytes=10_000)
    assert tier.put(key_for(1), b"a" * 100) and tier.put(key_for(2), b"b" * 50)
    redis_server.client().delete(BARE + "e:" + key_for(1))  # as the server's own maxmemory eviction would
    assert tier.get(key_for(1)) is None
    assert tier.keys() == [key_for(2)] and tier.used_bytes == 50 and key_for(1) not in tier
    tier.close()
