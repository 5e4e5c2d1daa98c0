"""The remote tier's values carry a keyed MAC (a real redis-server): whoever can write the server but
does not hold the secret cannot plant a value that is served, engines with different secrets never
serve or replace each other's entries (each has its own keys), and a remote tier without a secret opens only on a network declared
trusted."""

import logging

import pytest
import torch
from fusionrag_llm.storage import (
    AuthenticatedBytes,
    CodedTier,
    KVEntry,
    RawCodec,
    RedisBytes,
    StoreBudgets,
    StoreConfigError,
    StoreOptions,
    TieredStore,
    open_store,
    remote_key_prefix,
)
from storage_testutil import key_for, make_entry

BARE = "fusionrag:kv:"  # the default prefix: a trusted network's keys
SECRET = "the secret of engines A and B"
OTHER_SECRET = "the secret of another team"
PREFIX, OTHER_PREFIX = remote_key_prefix(BARE, SECRET), remote_key_prefix(BARE, OTHER_SECRET)
RAW = RawCodec()


def remote_store(folder, url, **auth) -> TieredStore:
    budgets = StoreBudgets(host_bytes=0, disk_bytes=2**26, remote_bytes=2**26)
    return TieredStore(folder, budgets, options=StoreOptions(remote_url=url, **auth))


def forged(seed: int) -> KVEntry:
    """Entry `seed` as an attacker would plant it: its token ids and meta, other numbers."""
    true = make_entry(seed)
    return KVEntry(true.token_ids, true.keys * -3.0, true.values + 1.0, dict(true.meta))


@pytest.mark.parametrize("mac", ["none", "made up", "copied from the real value"])
def test_a_value_forged_in_redis_with_a_valid_checksum_is_a_miss_not_served(tmp_path, redis_server, caplog, mac):
    server = redis_server.client()
    with remote_store(tmp_path / "writer", redis_server.url, remote_secret=SECRET) as writer:
        assert writer.put(key_for(1), make_entry(1))
    real = server.get(PREFIX + "e:" + key_for(1))
    before_frame = real[: len(real) - len(RAW.encode(make_entry(1), key=key_for(1)))]  # what the tier adds
    frame = RAW.encode(forged(1), key=key_for(1))  # a valid frame, bound to the real key
    assert RAW.decode_keyed(frame)[0] == key_for(1)
    added = {"none": b"", "made up": b"FRKA" + bytes(len(before_frame) - 4), "copied from the real value": before_frame}
    server.set(PREFIX + "e:" + key_for(1), added[mac] + frame)
    with remote_store(tmp_path / "reader", redis_server.url, remote_secret=SECRET) as reader:
        with caplog.at_level(logging.WARNING):
            assert reader.get(key_for(1), expect_token_ids=make_entry(1).token_ids) is None
        stats = reader.stats()
        assert stats.misses == 1 and stats.corrupt == 1 and stats.hits["remote"] == 0
        assert "not authenticated" in caplog.text and "treated as a miss" in caplog.text
        assert not server.exists(PREFIX + "e:" + key_for(1))  # dropped, like a corrupt value
        assert reader.put(key_for(1), make_entry(1))  # recomputed and shared again
    with remote_store(tmp_path / "third", redis_server.url, remote_secret=SECRET) as third:
        entry, tier = third.get(key_for(1))
        assert tier == "remote" and entry.bitwise_equal(make_entry(1))


def test_engines_with_different_secrets_keep_apart_on_one_server(tmp_path, redis_server, caplog):
    """Each secret has its own keys (and budget): neither team reads or replaces the other's values; a
    value copied from the other team's keys into ours is refused as written with another secret."""
    server = redis_server.client()
    ours = remote_store(tmp_path / "ours", redis_server.url, remote_secret=SECRET)
    theirs = remote_store(tmp_path / "theirs", redis_server.url, remote_secret=OTHER_SECRET)
    with ours, theirs:
        for seed in range(4):
            assert theirs.put(key_for(seed), make_entry(seed))
        assert key_for(0) not in ours and ours.get(key_for(0)) is None  # absent: an ingestion would compute it
        assert ours.stats().corrupt == 0 and ours.put(key_for(0), make_entry(10))
        assert server.hlen(PREFIX + "size") == 1 and server.hlen(OTHER_PREFIX + "size") == 4
        server.set(PREFIX + "e:" + key_for(1), server.get(OTHER_PREFIX + "e:" + key_for(1)))
        server.hset(PREFIX + "size", key_for(1), 1)
        with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage.mac_bytes"):
            assert ours.get(key_for(1)) is None and ours.stats().corrupt == 1
        assert "another secret" in caplog.text
    with remote_store(tmp_path / "theirs, new", redis_server.url, remote_secret=OTHER_SECRET) as theirs_again:
        for seed in range(4):  # all still theirs: our write of key 0 went under our own keys
            assert theirs_again.get(key_for(seed))[0].bitwise_equal(make_entry(seed))


def test_a_remote_tier_without_a_secret_is_refused_unless_the_network_is_declared_trusted(tmp_path, redis_server):
    with pytest.raises(ValueError, match="needs a secret") as refused:
        StoreOptions(remote_url=redis_server.url)
    assert "FUSIONRAG_REMOTE_SECRET" in str(refused.value) and "remote_trusted=True" in str(refused.value)
    with pytest.raises(StoreConfigError, match="needs a secret"):
        open_store(tmp_path / "s", torch.device("cpu"), remote=redis_server.url)
    with pytest.raises(ValueError, match="exclude each other"):
        StoreOptions(remote_url=redis_server.url, remote_secret=SECRET, remote_trusted=True)
    with pytest.raises(ValueError, match="at least 16 characters") as short:
        StoreOptions(remote_url=redis_server.url, remote_secret="hunter2")
    assert "hunter2" not in str(short.value)
    assert SECRET not in repr(StoreOptions(remote_url=redis_server.url, remote_secret=SECRET))


def test_on_a_trusted_network_values_carry_no_mac_and_are_shared(tmp_path, redis_server):
    """What the opt-in trusts: a value planted with a valid checksum is served."""
    server = redis_server.client()
    first = open_store(tmp_path / "a", torch.device("cpu"), remote=redis_server.url, kv_codec="model",
                       remote_trusted=True)  # fmt: skip
    with first, remote_store(tmp_path / "b", redis_server.url, remote_trusted=True) as second:
        assert first.put(key_for(1), make_entry(1))
        stored = server.get(BARE + "e:" + key_for(1))
        assert RAW.decode_keyed(stored)[1].bitwise_equal(make_entry(1))  # the bare frame
        assert second.get(key_for(1))[0].bitwise_equal(make_entry(1))
        server.set(BARE + "e:" + key_for(2), RAW.encode(forged(2), key=key_for(2)))
        server.hset(BARE + "size", key_for(2), 1)
        assert second.get(key_for(2))[0].bitwise_equal(forged(2))


def test_verify_reports_and_removes_a_value_without_a_valid_mac(tmp_path, redis_server):
    server = redis_server.client()
    with remote_store(tmp_path / "a", redis_server.url, remote_secret=SECRET) as store:
        assert store.put(key_for(1), make_entry(1)) and store.put(key_for(2), make_entry(2))
        server.set(PREFIX + "e:" + key_for(2), RAW.encode(forged(2), key=key_for(2)))
        report = store.verify()
        assert report.corrupt == [key_for(2)] and report.checked == 4  # two on disk, two on the server
        assert not server.exists(PREFIX + "e:" + key_for(2)) and server.exists(PREFIX + "e:" + key_for(1))


def test_a_shared_byte_tier_joins_a_store_only_behind_authentication(tmp_path, redis_server):
    raw = RedisBytes(redis_server.url, budget_bytes=2**20)
    with pytest.raises(ValueError, match="must authenticate its values"):
        TieredStore.from_tiers([CodedTier(raw)])
    store = TieredStore.from_tiers([CodedTier(AuthenticatedBytes(raw, SECRET))])
    assert store.put(key_for(1), make_entry(1)) and store.get(key_for(1))[1] == "remote"
    store.close()
