"""PrefetchLoader: background loading that overlaps the caller's work, and wait/ready semantics."""

import threading
import time

import pytest
from storage_testutil import key_for, make_entry

from fusionrag_llm.storage import PrefetchLoader, StoreBudgets, TieredStore


class SlowSource:
    """A store stand-in whose reads take `delay` seconds and can be held back by `gate`."""

    def __init__(self, delay=0.0, fail_on=None):
        self.delay, self.fail_on = delay, fail_on
        self.gate = threading.Event()
        self.gate.set()
        self.threads = set()

    def get(self, key, expect_token_ids=None, *, copy=None):
        self.threads.add(threading.get_ident())
        self.gate.wait(10)
        time.sleep(self.delay)
        if key == self.fail_on:
            raise OSError("disk went away")
        return (make_entry(0), "disk") if key != key_for(404) else None


def test_jobs_complete_while_the_caller_works():
    source = SlowSource(delay=0.02)
    with PrefetchLoader(source) as loader:
        loader.submit("r1", [key_for(i) for i in range(10)])
        assert not loader.ready("r1")  # 10 x 20 ms of loading just started
        iterations, deadline = 0, time.monotonic() + 10
        while not loader.ready("r1") and time.monotonic() < deadline:
            sum(i * i for i in range(2000))  # the caller's own work, never waiting on the loader
            iterations += 1
        assert loader.ready("r1") and iterations > 0
        result = loader.wait("r1", timeout=0)
    assert len(result.entries) == 10 and result.load_s >= 0.2
    assert threading.get_ident() not in source.threads


def test_wait_timeout_ready_and_handover():
    source = SlowSource()
    source.gate.clear()
    loader = PrefetchLoader(source)
    loader.submit("r1", [key_for(1), key_for(404)])
    assert not loader.ready("r1")
    with pytest.raises(TimeoutError, match="r1"):
        loader.wait("r1", timeout=0.05)
    assert loader.pending() == ["r1"]  # a timeout leaves the job in place
    with pytest.raises(ValueError, match="already has a prefetch job"):
        loader.submit("r1", [key_for(2)])
    source.gate.set()
    result = loader.wait("r1", timeout=10)
    assert list(result.entries) == [key_for(1)] and result.missing == [key_for(404)]
    assert result.tiers == {key_for(1): "disk"}
    with pytest.raises(KeyError, match="no prefetch job"):
        loader.ready("r1")  # handed over by wait
    stats = loader.stats()
    assert (stats.jobs_submitted, stats.jobs_done, stats.entries_loaded, stats.entries_missing) == (1, 1, 1, 1)
    assert stats.tier_hits == {"disk": 1}
    loader.close()
    with pytest.raises(RuntimeError, match="closed"):
        loader.submit("r2", [key_for(1)])


def test_failed_job_raises_from_wait():
    with PrefetchLoader(SlowSource(fail_on=key_for(3))) as loader:
        loader.submit("bad", [key_for(1), key_for(3)])
        with pytest.raises(OSError, match="disk went away"):
            loader.wait("bad", timeout=10)
        assert loader.stats().jobs_failed == 1


def test_discard_and_close_cancel_queued_jobs():
    source = SlowSource()
    source.gate.clear()
    loader = PrefetchLoader(source)
    running = loader.submit("running", [key_for(1)])
    queued = loader.submit("queued", [key_for(2)])
    other = loader.submit("other", [key_for(3)])
    loader.discard("queued")
    assert queued.cancelled() and loader.pending() == ["running", "other"]
    source.gate.set()
    loader.close(wait=True, cancel_pending=True)
    assert running.done() and not running.cancelled()
    assert other.cancelled() or other.done()


def test_prefetch_from_disk_into_host(tmp_path):
    directory = tmp_path / "store"
    with TieredStore(directory) as store:
        for seed in range(4):
            store.put(key_for(seed), make_entry(seed))
    with TieredStore(directory, StoreBudgets(host_bytes=2**20)) as store, PrefetchLoader(store) as loader:
        keys = [key_for(seed) for seed in range(4)]
        expected = {keys[3]: [0, 0, 0, 0]}  # wrong token ids: must come back as missing
        loader.submit("req", keys, expect_token_ids=expected)
        result = loader.wait("req", timeout=30)
        assert result.tiers == {key: "disk" for key in keys[:3]} and result.missing == [keys[3]]
        for seed in range(3):
            assert result.entries[keys[seed]].bitwise_equal(make_entry(seed))
            assert store.tier_of(keys[seed]) == "host"  # the engine's own get now hits memory
        assert store.get(keys[0])[1] == "host"
        assert loader.stats().load_s > 0


def test_bad_thread_count():
    with pytest.raises(ValueError, match="num_threads"):
        PrefetchLoader(SlowSource(), num_threads=0)


def test_pinning_loader_pins_until_released_discarded_or_closed():
    with TieredStore(None) as store:
        keys = [key_for(seed) for seed in range(3)]
        for seed, key in enumerate(keys):
            store.put(key, make_entry(seed))
        loader = PrefetchLoader(store, pin=True)
        loader.submit("taken", keys[:2] + [key_for(404)])
        result = loader.wait("taken", timeout=30)
        assert result.pinned == keys[:2] and [store.pin_count(k) for k in keys] == [1, 1, 0]
        loader.release(result)
        loader.release(result)  # once only
        assert store.stats().pinned == 0
        job = loader.submit("dropped", keys)
        assert job.result(timeout=30).pinned == keys  # loaded, then dropped without being taken
        loader.discard("dropped")
        assert store.stats().pinned == 0
        loader.submit("never taken", keys[1:])
        loader.close()
        assert store.stats().pinned == 0
