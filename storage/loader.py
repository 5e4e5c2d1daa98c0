"""Asynchronous prefetch of a request's entries into memory tiers while the engine computes.

This is the loader of the paper's asynchronous KV scheduler at request level: the scheduler submits
`(request_id, keys)` when a request is queued, keeps running ready requests, and starts this one
only once `ready(request_id)` is True (or blocks in `wait`).

Example:
    >>> import torch
    >>> from fusionrag_llm.storage import KVEntry, TieredStore
    >>> store = TieredStore(None)
    >>> _ = store.put("a" * 64, KVEntry((1,), torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4)))
    >>> with PrefetchLoader(store) as loader:
    ...     _ = loader.submit("req-1", ["a" * 64, "b" * 64])
    ...     result = loader.wait("req-1", timeout=10)
    >>> sorted(result.tiers.values()), len(result.missing)
    (['host'], 1)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import Protocol

from .entry import KVEntry


class EntrySource(Protocol):
    """What the loader needs from a store (`TieredStore` fits)."""

    def get(self, key: str, expect_token_ids=None, *, copy: bool | None = None,
            pin: bool = False) -> tuple[KVEntry, str] | None: ...  # fmt: skip

    def unpin(self, key: str) -> int: ...


@dataclass
class LoadResult:
    """Entries of one request: `entries[key]`, the tier each came from, and the keys not found.
    `pinned`: keys pinned for whoever took the result (a loader with `pin=True`); `release` them."""

    request_id: Hashable
    entries: dict[str, KVEntry] = field(default_factory=dict)
    tiers: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    load_s: float = 0.0
    pinned: list[str] = field(default_factory=list)


@dataclass
class LoaderStats:
    """Totals over the loader's life. `load_s` is time spent inside loading jobs (loader threads)."""

    jobs_submitted: int = 0
    jobs_done: int = 0
    jobs_failed: int = 0
    entries_loaded: int = 0
    entries_missing: int = 0
    load_s: float = 0.0
    tier_hits: dict[str, int] = field(default_factory=dict)


class PrefetchLoader:
    """Loads entries for queued requests on background threads.

    `copy` is passed to `store.get`: the default False hands out the tier's own tensors (read-only by
    contract, no extra copy); pass True when the consumer may modify them in place. `pin=True` pins
    every entry it loads until the taker calls `release(result)`, so eviction cannot drop or move
    the tier's tensors in between; results discarded or never taken are released by the loader.
    """

    def __init__(self, store: EntrySource, num_threads: int = 1, copy: bool = False, pin: bool = False):
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be an int >= 1, got {num_threads!r}")
        self._store = store
        self._copy = copy
        self._pin = pin
        self._executor = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="kv-loader")
        self._jobs: dict[Hashable, Future] = {}
        self._stats = LoaderStats()
        self._lock = threading.Lock()
        self._closed = False

    def submit(
        self,
        request_id: Hashable,
        keys: Sequence[str],
        expect_token_ids: Mapping[str, Sequence[int]] | None = None,
    ) -> Future:
        """Queue loading of `keys` for `request_id`; `ValueError` if that id already has a job."""
        keys = list(keys)
        expected = dict(expect_token_ids or {})
        with self._lock:
            if self._closed:
                raise RuntimeError("PrefetchLoader is closed")
            if request_id in self._jobs:
                raise ValueError(f"request {request_id!r} already has a prefetch job; wait or discard it first")
            future = self._executor.submit(self._load, request_id, keys, expected)
            self._jobs[request_id] = future
            self._stats.jobs_submitted += 1
        return future

    def ready(self, request_id: Hashable) -> bool:
        """True once the job of `request_id` finished (loaded, or failed: `wait` then raises)."""
        return self._job(request_id).done()

    def wait(self, request_id: Hashable, timeout: float | None = None) -> LoadResult:
        """Block until the job is done and hand over its result (the job is then forgotten).

        Raises `TimeoutError` after `timeout` seconds (the job stays queued), or the job's error.
        """
        future = self._job(request_id)
        try:
            result = future.result(timeout)
        except (FutureTimeoutError, TimeoutError):  # distinct classes on Python 3.10
            raise TimeoutError(f"prefetch of request {request_id!r} not done after {timeout} s") from None
        finally:
            if future.done():
                with self._lock:
                    self._jobs.pop(request_id, None)
        return result

    def discard(self, request_id: Hashable) -> None:
        """Forget a job, cancelling it if it has not started; the pins of its result are released."""
        with self._lock:
            future = self._jobs.pop(request_id, None)
        if future is not None and not future.cancel():
            future.add_done_callback(self._release_done)  # runs now if it already finished

    def release(self, result: LoadResult) -> None:
        """Unpin what the loader pinned for `result` (once; a second call does nothing)."""
        pinned, result.pinned = result.pinned, []
        for key in pinned:
            self._store.unpin(key)

    def _release_done(self, future: Future) -> None:
        if not future.cancelled() and future.exception() is None:
            self.release(future.result())

    def pending(self) -> list[Hashable]:
        """Request ids with a job not yet handed over by `wait`."""
        with self._lock:
            return list(self._jobs)

    def stats(self) -> LoaderStats:
        with self._lock:
            return LoaderStats(**{**self._stats.__dict__, "tier_hits": dict(self._stats.tier_hits)})

    def close(self, wait: bool = True, cancel_pending: bool = True) -> None:
        """Stop the loader threads; queued jobs are cancelled unless `cancel_pending=False`. Results
        never taken are released (now, or when their job ends)."""
        with self._lock:
            self._closed = True
            untaken, self._jobs = list(self._jobs.values()), {}
        self._executor.shutdown(wait=wait, cancel_futures=cancel_pending)
        for future in untaken:
            future.add_done_callback(self._release_done)

    def __enter__(self) -> PrefetchLoader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _job(self, request_id: Hashable) -> Future:
        with self._lock:
            future = self._jobs.get(request_id)
        if future is None:
            raise KeyError(f"no prefetch job for request {request_id!r}")
        return future

    def _load(self, request_id: Hashable, keys: list[str], expected: dict) -> LoadResult:
        start = time.perf_counter()
        result = LoadResult(request_id)
        try:
            for key in keys:
                found = self._get(key, expected.get(key))
                if found is None:
                    result.missing.append(key)
                else:
                    result.entries[key], result.tiers[key] = found
                    if self._pin:
                        result.pinned.append(key)
        except BaseException:
            self.release(result)
            with self._lock:
                self._stats.jobs_failed += 1
                self._stats.load_s += time.perf_counter() - start
            raise
        result.load_s = time.perf_counter() - start
        self._record(result)
        return result

    def _get(self, key: str, expected) -> tuple[KVEntry, str] | None:
        if self._pin:
            return self._store.get(key, expected, copy=self._copy, pin=True)
        return self._store.get(key, expected, copy=self._copy)

    def _record(self, result: LoadResult) -> None:
        with self._lock:
            stats = self._stats
            stats.jobs_done += 1
            stats.entries_loaded += len(result.entries)
            stats.entries_missing += len(result.missing)
            stats.load_s += result.load_s
            for tier in result.tiers.values():
                stats.tier_hits[tier] = stats.tier_hits.get(tier, 0) + 1
