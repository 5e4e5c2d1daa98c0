"""Request-level overlap of loading and computing (the paper's asynchronous KV scheduler).

While the engine computes one request, a loader thread fetches the entries of the next queued ones
from the store (disk -> memory). A request starts only when its entries are ready; among queued
requests the oldest ready one runs first, and when none is ready the scheduler waits for the
oldest. The choice of the next request is plain bookkeeping over ids (``pick_next``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from fusionrag_llm.engine.methods import RunPlan
from fusionrag_llm.request import Segment
from fusionrag_llm.storage import PrefetchLoader


@dataclass
class QueuedRequest:
    request_id: int
    segments: list[Segment]
    plan: RunPlan
    max_new_tokens: int


def pick_next(queued: Sequence[int], is_ready: Callable[[int], bool]) -> tuple[int, bool]:
    """(request id to run next, whether it is ready): the oldest ready one, else the oldest."""
    for request_id in queued:
        if is_ready(request_id):
            return request_id, True
    return queued[0], False


class RequestScheduler:
    """Runs queued requests through ``engine`` with entries prefetched ``lookahead`` requests ahead."""

    def __init__(self, engine, lookahead: int = 4, loader_threads: int = 1):
        if lookahead < 1:
            raise ValueError(f"lookahead must be >= 1, got {lookahead}")
        self.engine = engine
        self.lookahead = lookahead
        self.loader_threads = loader_threads

    def run(self, requests: Sequence[QueuedRequest]) -> list:
        """Generations in the order of ``requests``; each one's stats carry wait and prefetch times."""
        pending = {r.request_id: r for r in requests}
        order = [r.request_id for r in requests]
        results = {}
        with PrefetchLoader(self.engine.entries.store, num_threads=self.loader_threads) as loader:
            submitted: list[int] = []
            while order or submitted:
                while order and len(submitted) < self.lookahead:
                    self._submit(loader, pending[order[0]])
                    submitted.append(order.pop(0))
                request_id, _ = pick_next(submitted, loader.ready)
                submitted.remove(request_id)
                waited = time.perf_counter()
                loaded = loader.wait(request_id)
                results[request_id] = self._run(pending[request_id], loaded, time.perf_counter() - waited)
        return [results[r.request_id] for r in requests]

    def _submit(self, loader: PrefetchLoader, request: QueuedRequest) -> None:
        wanted = self.engine.resolver().keys_to_prefetch(request.segments, request.plan)
        loader.submit(request.request_id, [key for key, _ in wanted], dict(wanted))

    def _run(self, request: QueuedRequest, loaded, waited_s: float):
        preloaded = {key: (entry, loaded.tiers[key]) for key, entry in loaded.entries.items()}
        generation = self.engine.generate(request.segments, request.plan, request.max_new_tokens, preloaded=preloaded)
        stats = generation.stats
        stats.prefetch_s, stats.wait_s, stats.prefetched_entries = loaded.load_s, waited_s, len(preloaded)
        return generation
