"""Ingestion over Ray workers (a real local Ray cluster, a real store folder, real FAISS) leaves the
entries one process leaves, resumes after an interruption, and refuses what it cannot do."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from fusionrag_llm import FusionRAG
from fusionrag_llm.engine import ray_ingest, ray_watchdog
from fusionrag_llm.errors import MissingDependencyError
from fusionrag_llm.fusion.catalog import chunk_id_of

pytestmark = pytest.mark.slow  # other processes (see pyproject.toml)

COUNT, DIM, NEIGHBOURS = 12, 16, 3
VECTORS = np.random.default_rng(11).standard_normal((COUNT, DIM)).astype(np.float32)  # no ties among similarities
TEXTS = [f"Chunk {n}: the mill of village {n} grinds {n * 13} sacks a day." for n in range(COUNT)]
SHARING = {"prefix_cache": False, "remote_secret": "the secret the engines and workers share"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The entries of one process ingesting everything, with the workers' torch thread count (1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rag = FusionRAG.from_pretrained("tiny", store=tmp_path_factory.mktemp("one-process"),
                                        options={"prefix_cache": False})
        report = rag.add_chunks(TEXTS, neighbors=NEIGHBOURS, embeddings=VECTORS)
    finally:
        torch.set_num_threads(threads)
    assert (report.plain_computed, report.fused_computed) == (COUNT, COUNT)
    return entries_of(rag)


def entries_of(rag: FusionRAG) -> dict:
    """Every stored plain and fused entry of the texts, by (chunk number, variant)."""
    found = {}
    for number, text in enumerate(TEXTS):
        chunk_id = chunk_id_of(text)
        for variant in ("plain", "fused"):
            hit = rag.stored(chunk_id, variant) if chunk_id in rag.chunks else None
            if hit is not None:
                found[number, variant] = hit.entry
    return found


def assert_same_entries(found: dict, expected: dict) -> None:
    assert sorted(found) == sorted(expected)
    for where, entry in expected.items():
        assert torch.equal(found[where].keys, entry.keys) and torch.equal(found[where].values, entry.values), where
        assert found[where].meta.get("neighbours") == entry.meta.get("neighbours"), where


def test_ray_workers_store_the_entries_one_process_stores(ray_cluster, reference, tmp_path):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False})
    report = rag.add_chunks(TEXTS, neighbors=NEIGHBOURS, embeddings=VECTORS, workers=2)
    assert (report.plain_computed, report.fused_computed, report.evicted) == (COUNT, COUNT, 0)
    assert set(report.seconds) == {"cluster", "register", "workers_ready", "plain", "fused", "stop"}
    assert len(reference) == 2 * COUNT
    assert_same_entries(entries_of(rag), reference)
    assert all(len(entry.meta["neighbours"]) == NEIGHBOURS for (_, variant), entry in reference.items() if variant == "fused")
    again = rag.add_chunks(TEXTS, neighbors=NEIGHBOURS, embeddings=VECTORS, workers=1)
    assert (again.plain_computed, again.fused_computed) == (0, 0)


@pytest.mark.parametrize("stage", ["plain", "fused"])
def test_an_interrupted_run_is_resumed_computing_only_what_is_missing(ray_cluster, reference, tmp_path, monkeypatch, stage):
    completed = ray_ingest._completed

    def interrupted_after_one_batch(ray_, actors, method, batches, args):
        for done in completed(ray_, actors, method, batches, args):
            yield done
            if method == stage:
                raise KeyboardInterrupt  # Ctrl-C while the other batches are being computed

    stop, places = ray_ingest._stop, []

    def stop_recording_places(ray_, actors, refs, busy):
        stop(ray_, actors, refs, busy)
        places.extend(ray_.get(refs))

    monkeypatch.setattr(ray_ingest, "_completed", interrupted_after_one_batch)
    monkeypatch.setattr(ray_ingest, "_stop", stop_recording_places)
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False})
    with pytest.raises(KeyboardInterrupt):
        rag.add_chunks(TEXTS, neighbors=NEIGHBOURS, embeddings=VECTORS, workers=2)
    monkeypatch.undo()
    # no worker can write after the call returned: their processes have ended (Ray may report an actor
    # dead while its process still finishes a write)
    assert len(places) == 2 and all(ray_ingest.process_ended(pid) for _, pid in places)

    stored = entries_of(rag)
    plain = sum(variant == "plain" for _, variant in stored)
    fused = len(stored) - plain
    if stage == "plain":
        assert 0 < plain < COUNT and fused == 0
    else:
        assert plain == COUNT and 0 < fused < COUNT
    report = rag.add_chunks(TEXTS, neighbors=NEIGHBOURS, embeddings=VECTORS, workers=2)
    assert (report.plain_computed, report.fused_computed) == (COUNT - plain, COUNT - fused)
    assert_same_entries(entries_of(rag), reference)


def test_process_ended_tells_a_running_process_from_an_ended_or_zombie_one():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not ray_ingest.process_ended(child.pid)
    finally:
        child.kill()
    deadline = time.monotonic() + 10
    while not ray_ingest.process_ended(child.pid):  # a zombie until waited for: ended all the same
        assert time.monotonic() < deadline
        time.sleep(0.01)
    child.wait()
    assert ray_ingest.process_ended(child.pid)
    assert not ray_ingest.process_ended(os.getpid())


class FakeRay:
    """What ``_cluster`` asks of Ray; records the watchdog's mark that ``init`` would give the processes."""

    def __init__(self, initialized: bool):
        self.initialized, self.calls = initialized, []

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **options) -> None:
        self.calls.append(("init", os.environ.get(ray_watchdog.MARK)))

    def shutdown(self) -> None:
        self.calls.append(("shutdown", None))


def test_a_running_cluster_is_left_alone_and_only_a_started_one_is_marked_for_the_watchdog():
    running, started = FakeRay(initialized=True), FakeRay(initialized=False)
    with ray_ingest._cluster(running):
        pass
    with ray_ingest._cluster(started):
        pass
    assert running.calls == []  # never started, shut down or watched
    (init, mark), shutdown = started.calls
    assert init == "init" and shutdown == ("shutdown", None)
    assert (mark is not None) == sys.platform.startswith("linux")
    assert ray_watchdog.MARK not in os.environ  # only the processes ray.init starts carry it


@pytest.mark.parametrize("workers", [0, -1, 1.5, "2", True, 1025])
def test_bad_worker_counts_are_refused(tmp_path, workers):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False})
    with pytest.raises(ValueError, match=r"workers must be None \(ingest in this process\) or an int from 1 to 1024"):
        rag.add_chunks(TEXTS, embeddings=VECTORS, workers=workers)


def test_a_store_in_memory_cannot_be_shared_with_workers():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    with pytest.raises(ValueError, match=r"needs a store folder .* in memory"):
        rag.add_chunks(TEXTS, embeddings=VECTORS, workers=2)
    with pytest.raises(ValueError, match=r"needs a store folder .* in memory"):  # add_chunks takes the same path
        rag.add_chunks(TEXTS, embeddings=VECTORS, workers=1)
    assert len(rag.chunks) == 0  # refused before anything was registered


def test_more_workers_than_the_cluster_has_cpus_are_refused(ray_cluster, tmp_path):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False})
    with pytest.raises(ValueError, match=r"workers=3 needs 3 CPUs in the Ray cluster, which has 2; use workers <= 2"):
        rag.add_chunks(TEXTS, embeddings=VECTORS, workers=3)


def test_without_ray_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where it is not installed
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False})
    with pytest.raises(MissingDependencyError, match=r'pip install "fusionrag_llm\[distributed\]"'):
        rag.add_chunks(TEXTS, embeddings=VECTORS, workers=2)


def test_a_write_error_in_a_worker_reaches_the_caller_whole():
    import pickle
    from pathlib import Path

    from fusionrag_llm.fusion.offline import IngestionWriteError, IngestReport

    error = IngestionWriteError(Path("/kv"), OSError(28, "No space left on device"), IngestReport(["a"], 1, 2))
    copy = pickle.loads(pickle.dumps(error))  # how Ray carries a worker's exception to the driver
    assert (copy.directory, str(copy), copy.report) == (error.directory, str(error), error.report)


def test_ray_is_imported_only_when_workers_are_asked_for():
    code = ("import sys, fusionrag_llm.api, fusionrag_llm.engine.ray_ingest, fusionrag_llm.cli.main; "
            "print('ray' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_ray_workers_write_into_the_shared_remote_tier(ray_cluster, reference, redis_server, tmp_path):
    """Workers reopen the engine's store with its Redis tier and its secret: an engine on another folder,
    sharing only the server and the secret, reads every entry they computed from it, the same numbers as
    one process's."""
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path / "first",
                                    options={**SHARING, "remote": redis_server.url})
    report = rag.add_chunks(TEXTS, neighbors=NEIGHBOURS, embeddings=VECTORS, workers=2)
    assert (report.plain_computed, report.fused_computed) == (COUNT, COUNT)
    other = FusionRAG.from_pretrained("tiny", store=tmp_path / "second",
                                      options={**SHARING, "remote": redis_server.url})
    found = {}
    for number, text in enumerate(TEXTS):
        token_ids = rag.chunks[chunk_id_of(text)].token_ids  # registered in the first store only
        for variant in ("plain", "fused"):
            hit = other.stored(token_ids, variant)
            assert hit is not None and hit.tier == "remote", (number, variant)
            found[number, variant] = hit.entry
    assert_same_entries(found, reference)
