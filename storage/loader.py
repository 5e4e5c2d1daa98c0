"""Asynchronous prefetch of a request's entries into memory tiers while the engine computes.

This is the loader of the paper's asynchronous KV scheduler at request level: the scheduler submits
`(request_id, keys)` when a request is queued, keeps running ready requests, and starts this one
only once `ready(request_id)` is True (or blocks in `wait`).

Example:
    >>> import torch
    >>> from fusionrag_llm.storage import KVEntry, TieredStore
    >>> store = TieredStore(None)
    >>> _ = store.put("a" * 64, KVEntry((1,), torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4)))
    >>> loader = PrefetchLoader(store)
    >>> _ = loader.submit("req-1", ["a" * 64, "b" * 64])
    >>> result = loader.wait("req-1")
    >>> list(result.tiers.values()), result.pinned == ["a" * 64], store.pin_count("a" * 64)
    (['host'], True, 1)
    >>> for key in result.pinned:
    ...     _ = store.unpin(key)
    >>> loader.close()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .entry import KVEntry

if TYPE_CHECKING:
    from .tiered import TieredStore


@dataclass
class LoadResult:
    """Entries of one request: `entries[key]` and the tier each came from (keys not found are absent).
    `pinned`: the keys found, pinned in the store for whoever took the result, who unpins them."""

    request_id: Hashable
    entries: dict[str, KVEntry] = field(default_factory=dict)
    tiers: dict[str, str] = field(default_factory=dict)
    load_s: float = 0.0
    pinned: list[str] = field(default_factory=list)


class PrefetchLoader:
    """Loads entries for queued requests on a background thread.

    Entries are the tier's own tensors (`store.get(..., copy=False)`: read-only by contract, no extra
    copy), each pinned until the taker of the result unpins it, so eviction cannot drop or move the
    tier's tensors in between; results discarded or never taken are unpinned by the loader.
    """

    def __init__(self, store: TieredStore):
        self._store = store
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-loader")
        self._jobs: dict[Hashable, Future] = {}
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
        return future

    def ready(self, request_id: Hashable) -> bool:
        """True once the job of `request_id` finished (loaded, or failed: `wait` then raises)."""
        return self._job(request_id).done()

    def wait(self, request_id: Hashable) -> LoadResult:
        """Block until the job is done and hand over its result (the job is then forgotten), or raise its error."""
        future = self._job(request_id)
        try:
            return future.result()
        finally:
            if future.done():  # interrupted while waiting: the job stays, so its pins are still released
                with self._lock:
                    self._jobs.pop(request_id, None)

    def discard(self, request_id: Hashable) -> None:
        """Forget a job, cancelling it if it has not started; the pins of its result are released."""
        with self._lock:
            future = self._jobs.pop(request_id, None)
        if future is not None and not future.cancel():
            future.add_done_callback(self._release_done)  # runs now if it already finished

    def close(self) -> None:
        """Stop the loader thread once its running job ends; queued jobs are cancelled. Results never
        taken are released."""
        with self._lock:
            self._closed = True
            untaken, self._jobs = list(self._jobs.values()), {}
        self._executor.shutdown(wait=True, cancel_futures=True)
        for future in untaken:
            future.add_done_callback(self._release_done)

    def _job(self, request_id: Hashable) -> Future:
        with self._lock:
            future = self._jobs.get(request_id)
        if future is None:
            raise KeyError(f"no prefetch job for request {request_id!r}")
        return future

    def _release(self, result: LoadResult) -> None:
        """Unpin what the loader pinned for `result` (once; a second call does nothing)."""
        pinned, result.pinned = result.pinned, []
        for key in pinned:
            self._store.unpin(key)

    def _release_done(self, future: Future) -> None:
        if not future.cancelled() and future.exception() is None:
            self._release(future.result())

    def _load(self, request_id: Hashable, keys: list[str], expected: dict) -> LoadResult:
        start = time.perf_counter()
        result = LoadResult(request_id)
        try:
            for key in keys:
                found = self._store.get(key, expected.get(key), copy=False, pin=True)
                if found is not None:
                    result.entries[key], result.tiers[key] = found
                    result.pinned.append(key)
        except BaseException:
            self._release(result)
            raise
        result.load_s = time.perf_counter() - start
        return result
