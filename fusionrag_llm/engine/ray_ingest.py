"""Ingestion fanned out over Ray worker processes that write into one shared store folder.

The driver (the calling process) embeds and registers the chunks in the store's catalog, exactly
as one process would, so every process numbers them alike. Then two stages go to the workers in
batches of chunk ids, each worker an actor that loaded the model once from an ``EngineSpec``
(plain data: model name, dtype, fused layout, store folder and settings) and writes entries
straight into the store:

1. plain entries of the chunks that have none;
2. after *all* plain entries are stored (a fused entry is computed after its neighbours' plain
   entries): for each chunk, its neighbour search (FAISS, in the worker, over the catalog it reads
   from the store) and its fused entry, unless the catalog records one computed after the same
   neighbours. Stale fused entries of chunks registered earlier (their nearest chunks changed)
   are sent along.

Entries already stored are skipped at both stages, so a re-run after an interruption computes only
what is missing. Entries are the same bits as one process computes when the computation is
(plain entries are computed one chunk per forward pass, see ``fusion/offline.py``); on CPU that
needs the same torch thread count in the workers (``EngineSpec.threads``, one per worker by
default) as in the process they are compared with.

A running Ray cluster is used as it is. A local one started for the call ends with the calling
process, even one killed by SIGKILL: a watchdog process (``ray_watchdog``, Linux) then kills all its
processes, workers included, within a fraction of a second, so none goes on writing into the store.
"""

from __future__ import annotations

import logging
import math
import os
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
from tqdm.auto import tqdm

from fusionrag_llm.errors import FusionRAGError, require
from fusionrag_llm.engine.ray_watchdog import Watchdog
from fusionrag_llm.engine.worker_spec import EngineSpec
from fusionrag_llm.fusion.catalog import CatalogWriteError, ChunkCatalog, RegisteredChunk, chunk_id_of
from fusionrag_llm.fusion.entry_compute import EntryComputer
from fusionrag_llm.fusion.offline import (IngestReport, count_evicted, fuse_chunk, missing_plain, register_chunks,
                                          stale_chunks, store_plain, validate_neighbors, validate_texts,
                                          wrap_write_errors)  # fmt: skip
from fusionrag_llm.fusion.embeddings import Embedder
from fusionrag_llm.models.loader import LoadedModel
from fusionrag_llm.storage import StoreWriteError

logger = logging.getLogger(__name__)
MAX_WORKERS = 1024
STOP_TIMEOUT_S = 30.0
WAIT_S = 0.5  # a wait for the next finished batch returns this often, so that Ctrl-C interrupts it
MAX_BATCH = 32  # chunks per batch at most; smaller batches balance the workers' load better


def check_workers(workers: object) -> int | None:
    """``None`` (ingest in this process) or a number of Ray worker processes.

    >>> check_workers(2), check_workers(None)
    (2, None)
    >>> check_workers(0)
    Traceback (most recent call last):
    ...
    fusionrag_llm.errors.FusionRAGError: workers must be None (ingest in this process) or an int from 1 to 1024 (Ray worker processes), got 0
    """
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise FusionRAGError(f"workers must be None (ingest in this process) or an int from 1 to {MAX_WORKERS} "
                             f"(Ray worker processes), got {workers!r}")  # fmt: skip
    return workers


class IngestWorker:
    """One worker process's engine parts, loaded once; computes batches of chunks (a Ray actor)."""

    def __init__(self, spec: EngineSpec):
        torch.set_num_threads(spec.threads)  # the CPUs Ray gave this actor, and the same sums every run
        self.computer, self.catalog = spec.build()

    def ready(self) -> bool:
        return True

    def place(self) -> tuple[str, int]:
        """``(Ray node id, process id)`` of this worker: where a stopped call waits for it to end."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def plain(self, chunk_ids: list[str]) -> tuple[int, int]:
        """Store the plain entries of these chunks that are missing; ``(plain, fused)`` computed."""
        report = IngestReport([])
        with self._writing(report):
            # another process may have stored some
            for chunk in missing_plain(self.computer.entry_store, self._chunks(chunk_ids)):
                store_plain(self.computer, chunk, report)
        return report.plain_computed, report.fused_computed

    def fused(self, tasks: list[tuple[str, int]], notes: bool) -> tuple[int, int]:
        """Make each ``(chunk id, neighbour count)``'s fused entry current; ``(plain, fused)`` computed."""
        report = IngestReport([])
        chunks = self._chunks([chunk_id for chunk_id, _ in tasks])
        with self._writing(report):
            for chunk, (_, count) in zip(chunks, tasks):
                fuse_chunk(self.computer, self.catalog, chunk, count, report, notes)
        return report.plain_computed, report.fused_computed

    def _chunks(self, chunk_ids: list[str]) -> list[RegisteredChunk]:
        self.catalog.refresh()  # the driver registered them before sending their ids
        chunks = [self.catalog.by_id(chunk_id) for chunk_id in chunk_ids]
        if any(chunk is None for chunk in chunks):
            folder = self.computer.entry_store.store.directory
            raise FusionRAGError(f"the catalog at {folder} lacks chunks the driver registered")
        return chunks

    @contextmanager
    def _writing(self, report: IngestReport) -> Iterator[None]:
        try:
            yield
        except (StoreWriteError, CatalogWriteError) as exc:
            raise wrap_write_errors(self.computer.entry_store, exc, report) from exc


def ingest_with_workers(loaded: LoadedModel, computer: EntryComputer, catalog: ChunkCatalog, texts: Sequence[str],
                        workers: int, fuse: bool = True, neighbors: int = 10, embeddings=None,
                        embedder: Embedder | None = None, progress: bool = False,
                        variant_notes: bool = False, tenant: str = "") -> IngestReport:  # fmt: skip
    """``add_chunks`` with the entries computed by ``workers`` Ray actors (see the module docstring);
    ``computer`` and ``catalog`` are ``tenant``'s, and so are the workers'.

    Uses the running Ray cluster (``ray.init`` by the caller), else starts a local one for the call.
    """
    check_workers(workers)
    texts = validate_texts(texts)
    validate_neighbors(neighbors)
    spec = EngineSpec.of(loaded, computer.entry_store, tenant=tenant)  # refuses a store in memory before anything starts
    ray = require("ray", "distributed", "ingestion with workers=")
    report = IngestReport(chunk_ids=[chunk_id_of(text) for text in texts])
    clock = _Clock(report)
    with _cluster(ray):
        clock.lap("cluster")
        with _actors(ray, spec, workers) as (actors, places):
            try:
                chunks = register_chunks(computer, catalog, loaded.tokenizer.encode, texts, embeddings, embedder)
            except (StoreWriteError, CatalogWriteError) as exc:
                raise wrap_write_errors(computer.entry_store, exc, report) from exc
            clock.lap("register")
            ray.get(places)  # the model loads overlapped the registration
            clock.lap("workers_ready")
            ids = [chunk.chunk_id for chunk in missing_plain(computer.entry_store, chunks)]
            _run_stage(ray, actors, "plain", _batches(ids, workers), (), report, progress)
            clock.lap("plain")
            if fuse:
                _fuse_stage(ray, actors, computer, catalog, chunks, neighbors, variant_notes, report, progress)
                clock.lap("fused")
        clock.lap("stop")
    catalog.refresh()  # the workers' fused records
    count_evicted(computer.entry_store, catalog, chunks, fuse, report)
    return report


def _fuse_stage(ray, actors: list, computer: EntryComputer, catalog: ChunkCatalog, chunks: list[RegisteredChunk],
                neighbors: int, notes: bool, report: IngestReport, progress: bool) -> None:  # fmt: skip
    given = {chunk.chunk_id for chunk in chunks}
    tasks = [(chunk.chunk_id, neighbors) for chunk in chunks]
    stale = stale_chunks(computer.keys, catalog)
    tasks += [(chunk.chunk_id, count) for chunk, count in stale if chunk.chunk_id not in given]
    _run_stage(ray, actors, "fused", _batches(tasks, len(actors)), (notes,), report, progress)
    # another process may have registered closer chunks meanwhile: what is stale now is refreshed here
    try:
        for chunk, count in stale_chunks(computer.keys, catalog):
            fuse_chunk(computer, catalog, chunk, count, report, notes)
    except (StoreWriteError, CatalogWriteError) as exc:
        raise wrap_write_errors(computer.entry_store, exc, report) from exc


def _run_stage(ray, actors: list, method: str, batches: list[list], args: tuple, report: IngestReport,
               progress: bool) -> None:  # fmt: skip
    bar = tqdm(total=sum(map(len, batches)), desc=f"{method} entries", unit="chunk", disable=not progress or not batches)
    with bar:
        for size, (plain, fused) in _completed(ray, actors, method, batches, args):
            report.plain_computed += plain
            report.fused_computed += fused
            bar.update(size)


def _completed(ray, actors: list, method: str, batches: list[list], args: tuple) -> Iterator[tuple[int, tuple[int, int]]]:
    """``(batch size, what the worker computed)`` for each batch as it completes; a worker that finishes
    a batch gets the next one, so faster workers take more."""
    queue, pending = list(reversed(batches)), {}

    def submit(actor) -> None:
        if queue:
            batch = queue.pop()
            pending[getattr(actor, method).remote(batch, *args)] = (actor, len(batch))

    for actor in actors:
        submit(actor)
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=WAIT_S)  # not for ever: Ctrl-C is seen here
        if not done:
            continue
        ref = done[0]
        actor, size = pending.pop(ref)
        yield size, tuple(ray.get(ref))  # a worker's error is raised here, as its own type
        submit(actor)


def _batches(items: list, workers: int) -> list[list]:
    """Items in batches of up to ``MAX_BATCH``, at least about four per worker."""
    size = max(1, min(MAX_BATCH, math.ceil(len(items) / (4 * workers))))
    return [items[start : start + size] for start in range(0, len(items), size)]


@contextmanager
def _cluster(ray) -> Iterator[None]:
    """The running Ray cluster, or a local one started (and shut down) for this call, whose processes
    end with this process even when it is killed (see ``ray_watchdog``)."""
    if ray.is_initialized():
        yield
        return
    with Watchdog() as watchdog:
        with watchdog.marking():  # a cluster that ray.init only connects to starts no process here
            ray.init(include_dashboard=False, logging_level=logging.WARNING)
        try:
            yield
        finally:
            ray.shutdown()


@contextmanager
def _actors(ray, spec: EngineSpec, workers: int) -> Iterator[tuple[list, list]]:
    """``workers`` actors built from ``spec`` and the references to their places (``IngestWorker.place``,
    ready once each has loaded its model); stopped on the way out (an interrupted call stops them)."""
    gpus = 1 if spec.device.startswith("cuda") else 0
    _check_capacity(ray.cluster_resources(), workers, spec.threads, gpus)
    actor_class = ray.remote(num_cpus=spec.threads, num_gpus=gpus)(IngestWorker)
    actors = [actor_class.remote(spec) for _ in range(workers)]
    places = [actor.place.remote() for actor in actors]
    try:
        yield actors, places
    except BaseException:
        _stop(ray, actors, places, busy=True)  # batches may still be running
        raise
    _stop(ray, actors, places, busy=False)


def _stop(ray, actors: list, places: list, busy: bool) -> None:
    """Kill the actors and wait until Ray reports them gone; when ``busy`` (the call ends in an error or
    an interruption while batches may run) also until their processes have ended: Ray can report an
    actor dead while its process still finishes a write, and no worker may write after the call
    returns (an interrupted call is re-run; a batch cut short leaves whole entries only)."""
    for actor in actors:
        ray.kill(actor)
    for actor in actors:
        try:
            ray.get(actor.ready.remote(), timeout=STOP_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass  # the expected answer: the actor is gone
    if busy:
        _wait_for_processes(ray, places)


def _wait_for_processes(ray, places: list) -> None:
    """Wait until the worker processes that reported a place have ended, each checked on its own node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    check, checks = ray.remote(num_cpus=0)(_wait_until_ended), {}
    for place in places:
        try:
            node, pid = ray.get(place, timeout=STOP_TIMEOUT_S)
        except ray.exceptions.RayError:
            continue  # killed before it loaded its model: it never received a batch
        strategy = NodeAffinitySchedulingStrategy(node, soft=False)
        checks[check.options(scheduling_strategy=strategy).remote(pid, STOP_TIMEOUT_S)] = (node, pid)
    for ref, (node, pid) in checks.items():
        try:
            ended = ray.get(ref, timeout=2 * STOP_TIMEOUT_S)
        except ray.exceptions.RayError as exc:  # its node is gone (and the process with it) or unreachable
            logger.warning("could not check that ingestion worker %s on node %s ended: %s", pid, node, exc)
            continue
        if not ended:
            logger.warning("ingestion worker %s on node %s still runs %.0f s after it was killed: entries it "
                           "writes may appear after this call", pid, node, STOP_TIMEOUT_S)  # fmt: skip


def _wait_until_ended(pid: int, timeout_s: float) -> bool:
    """True once process ``pid`` of this machine has ended (or is a zombie); False after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not process_ended(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def process_ended(pid: int) -> bool:
    """Whether process ``pid`` of this machine no longer runs (absent, or a zombie not yet reaped)."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]  # the field after the command name
        except (FileNotFoundError, ProcessLookupError):
            return True
        return state in (b"Z", b"X")
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # exists, owned by another user
    return False


def _check_capacity(resources: dict, workers: int, threads: int, gpus: int) -> None:
    """Refuse what the cluster cannot run at once: the call would wait for ever for the missing actors."""
    for name, each in (("CPU", threads), ("GPU", gpus)):
        have = int(resources.get(name, 0))
        if each and workers * each > have:
            raise FusionRAGError(f"workers={workers} needs {workers * each} {name}s in the Ray cluster, which has {have}; "
                                 f"use workers <= {have // each}, or add machines to the cluster")  # fmt: skip


class _Clock:
    """Seconds of each stage, into ``report.seconds``."""

    def __init__(self, report: IngestReport):
        self.report, self.start = report, time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.report.seconds[stage] = now - self.start
        self.start = now
