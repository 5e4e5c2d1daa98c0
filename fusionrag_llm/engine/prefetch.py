"""Loading the chunk entries of waiting sequences on a background thread.

The loader thread exists only while prefetching sequences wait: it is started by the first one and
closed once none is left, so an idle engine holds no threads. What it loads stays pinned in the
store (eviction can neither drop nor move it) until the sequence's context is assembled
(``ContextResolver.release``) or the sequence is dropped.
"""

from __future__ import annotations

import time
from typing import Iterable

from fusionrag_llm.engine.resolve import Preloaded
from fusionrag_llm.engine.sequence import Sequence
from fusionrag_llm.storage import PrefetchLoader


class Prefetcher:
    def __init__(self, store):
        self.store = store
        self._loader: PrefetchLoader | None = None
        self._submitted: set[int] = set()

    def submit(self, seqs: Iterable[Sequence]) -> None:
        for seq in seqs:
            if seq.request_id in self._submitted:
                continue
            wanted = seq.context_plan.prefetch_keys()
            if self._loader is None:
                self._loader = PrefetchLoader(self.store, pin=True)
            self._loader.submit(seq.request_id, [key for key, _ in wanted], dict(wanted))
            self._submitted.add(seq.request_id)

    def ready(self, seq: Sequence) -> bool:
        """Whether admitting ``seq`` now would not wait for the loader."""
        if seq.request_id in self._submitted:
            return self._loader.ready(seq.request_id)
        return not seq.prefetch  # a prefetching sequence not submitted yet is not ready

    def take(self, seq: Sequence) -> tuple[Preloaded | None, list[str]]:
        """The entries loaded for ``seq`` (waiting for them if needed) and the keys pinned for them,
        which the taker unpins; else what the caller preloaded, with no pins."""
        if seq.request_id not in self._submitted:
            return seq.preloaded, []
        self._submitted.discard(seq.request_id)
        waited = time.perf_counter()
        loaded = self._loader.wait(seq.request_id)
        seq.stats.wait_s = time.perf_counter() - waited
        seq.stats.prefetch_s, seq.stats.prefetched_entries = loaded.load_s, len(loaded.entries)
        found = {key: (entry, loaded.tiers[key]) for key, entry in loaded.entries.items()}
        return {**(seq.preloaded or {}), **found}, loaded.pinned

    def discard(self, seq: Sequence) -> None:
        if seq.request_id in self._submitted:
            self._submitted.discard(seq.request_id)
            self._loader.discard(seq.request_id)

    def release_if_idle(self, waiting: Iterable[Sequence]) -> None:
        if self._loader is not None and not self._submitted and not any(seq.prefetch for seq in waiting):
            self._loader.close()
            self._loader = None
