"""PrefetchLoader: background loading that overlaps the caller's work, ready/wait semantics, and the
pins it holds for a result until the taker unpins it or the loader drops it."""

import threading
import time

import pytest
from storage_testutil import key_for, make_entry

from fusionrag_llm.storage import PrefetchLoader, StoreBudgets, TieredStore


class SlowSource:
    """A store stand-in whose reads take `delay` seconds and can be held back by `gate`; counts pins."""

    def __init__(self, delay=0.0, fail_on=None):
        self.delay, self.fail_on = delay, fail_on
        self.gate = threading.Event()
        self.gate.set()
        self.threads = set()
        self.pins: dict[str, int] = {}
        self._lock = threading.Lock()

    def get(self, key, expect_token_ids=None, *, copy=None, pin=False):
        self.threads.add(threading.get_ident())
        self.gate.wait(10)
        time.sleep(self.delay)
        if key == self.fail_on:
            raise OSError("disk went away")
        if key == key_for(404):
            return None
        if pin:
            with self._lock:
                self.pins[key] = self.pins.get(key, 0) + 1
        return make_entry(0), "disk"

    def unpin(self, key):
        with self._lock:
            self.pins[key] -= 1
            return self.pins[key]

    def pinned(self):
        with self._lock:
            return sum(self.pins.values())


def test_jobs_complete_while_the_caller_works():
    source = SlowSource(delay=0.02)
    loader = PrefetchLoader(source)
    loader.submit("r1", [key_for(i) for i in range(10)])
    assert not loader.ready("r1")  # 10 x 20 ms of loading just started
    iterations, deadline = 0, time.monotonic() + 10
    while not loader.ready("r1") and time.monotonic() < deadline:
        sum(i * i for i in range(2000))  # the caller's own work, never waiting on the loader
        iterations += 1
    assert loader.ready("r1") and iterations > 0
    result = loader.wait("r1")
    loader.close()
    assert len(result.entries) == 10 and result.load_s >= 0.2
    assert threading.get_ident() not in source.threads


def test_ready_wait_and_handover():
    source = SlowSource()
    source.gate.clear()
    loader = PrefetchLoader(source)
    loader.submit("r1", [key_for(1), key_for(404)])
    assert not loader.ready("r1")
    with pytest.raises(ValueError, match="already has a prefetch job"):
        loader.submit("r1", [key_for(2)])
    source.gate.set()
    result = loader.wait("r1")
    assert list(result.entries) == [key_for(1)]  # the key not found is absent
    assert result.tiers == {key_for(1): "disk"} and result.pinned == [key_for(1)]
    with pytest.raises(KeyError, match="no prefetch job"):
        loader.ready("r1")  # handed over by wait
    with pytest.raises(KeyError, match="no prefetch job"):
        loader.wait("r1")
    loader.close()
    with pytest.raises(RuntimeError, match="closed"):
        loader.submit("r2", [key_for(1)])


def test_failed_job_raises_from_wait_and_drops_its_pins():
    source = SlowSource(fail_on=key_for(3))
    loader = PrefetchLoader(source)
    loader.submit("bad", [key_for(1), key_for(3)])
    with pytest.raises(OSError, match="disk went away"):
        loader.wait("bad")
    assert source.pins == {key_for(1): 0}  # pinned by the lookup, unpinned when the job failed
    loader.close()


def test_discard_and_close_cancel_queued_jobs():
    source = SlowSource()
    source.gate.clear()
    loader = PrefetchLoader(source)
    running = loader.submit("running", [key_for(1)])
    queued = loader.submit("queued", [key_for(2)])
    other = loader.submit("other", [key_for(3)])
    loader.discard("queued")
    assert queued.cancelled()
    with pytest.raises(KeyError, match="no prefetch job"):
        loader.ready("queued")
    assert not loader.ready("running") and not loader.ready("other")
    source.gate.set()
    loader.close()
    assert running.done() and not running.cancelled()
    assert other.cancelled() or other.done()
    assert source.pinned() == 0  # the running job's result, never taken, was unpinned


def test_discarding_a_running_job_drops_its_pins_when_it_ends():
    source = SlowSource()
    source.gate.clear()
    loader = PrefetchLoader(source)
    job = loader.submit("r", [key_for(1), key_for(2)])
    while not source.threads:  # the job has started: it cannot be cancelled any more
        time.sleep(0.001)
    loader.discard("r")
    assert source.pinned() == 0
    source.gate.set()
    loader.close()  # waits for the job (and its callbacks) to end
    assert job.result().pinned == [] and source.pins == {key_for(1): 0, key_for(2): 0}  # released as it ended


def test_prefetch_from_disk_into_host(tmp_path):
    directory = tmp_path / "store"
    with TieredStore(directory) as store:
        for seed in range(4):
            store.put(key_for(seed), make_entry(seed))
    with TieredStore(directory, StoreBudgets(host_bytes=2**20)) as store:
        loader = PrefetchLoader(store)
        keys = [key_for(seed) for seed in range(4)]
        expected = {keys[3]: [0, 0, 0, 0]}  # wrong token ids: must come back as missing
        loader.submit("req", keys, expect_token_ids=expected)
        result = loader.wait("req")
        assert result.tiers == {key: "disk" for key in keys[:3]} and keys[3] not in result.entries
        for seed in range(3):
            assert result.entries[keys[seed]].bitwise_equal(make_entry(seed))
            assert store.tier_of(keys[seed]) == "host"  # the engine's own get now hits memory
        assert store.get(keys[0])[1] == "host"
        assert result.load_s > 0
        loader.close()


def test_pins_are_held_until_the_taker_unpins_or_the_loader_drops_the_result():
    with TieredStore(None) as store:
        keys = [key_for(seed) for seed in range(3)]
        for seed, key in enumerate(keys):
            store.put(key, make_entry(seed))
        loader = PrefetchLoader(store)
        loader.submit("taken", keys[:2] + [key_for(404)])
        result = loader.wait("taken")
        assert result.pinned == keys[:2] and [store.pin_count(k) for k in keys] == [1, 1, 0]
        for key in result.pinned:  # the taker unpins once the KV is placed
            store.unpin(key)
        assert store.stats().pinned == 0
        job = loader.submit("dropped", keys)
        assert job.result(timeout=30).pinned == keys  # loaded, then dropped without being taken
        loader.discard("dropped")
        assert store.stats().pinned == 0
        loader.submit("never taken", keys[1:])
        loader.close()
        assert store.stats().pinned == 0
