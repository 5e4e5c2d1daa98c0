"""Processes ingesting into one store at once leave exactly the fused entries one process would leave.

A fused entry depends on every chunk of the store (its neighbours are the most similar of all), so a
process that fuses with an old view of the catalog, or writes last with an older view than another
process, leaves a wrong entry. Real processes first, then the two races, replayed deterministically
with two engines on one store folder in this process.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fusionrag_llm import FusionRAG
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.fusion.entry_compute import EntryComputer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from concurrent_ingest_worker import COUNT, NEIGHBOURS, VECTORS, text_of  # noqa: E402

WORKER = str(HERE.parent / "concurrent_ingest_worker.py")
# 4 overlapping subsets of the 24 chunks (9 each, 3 shared with the next), together all of them
SUBSETS = [[(6 * w + i) % COUNT for i in range(9)] for w in range(4)]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # same threads everywhere: same floating-point sums


def start_worker(store: Path, sync: Path | str, name: str, numbers: list[int]) -> subprocess.Popen:
    command = [sys.executable, WORKER, str(store), str(sync), name, ",".join(map(str, numbers))]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def fused_entries(store: Path) -> dict[int, object]:
    rag = FusionRAG.from_pretrained("tiny", store=store, options={"prefix_cache": False})
    found = {}
    for number in range(COUNT):
        chunk_id = chunk_id_of(text_of(number))
        assert chunk_id in rag.chunks, f"chunk {number} is not registered in {store}"
        hit = rag.stored(chunk_id, "fused")
        assert hit is not None, f"chunk {number} has no fused entry in {store}"
        found[number] = hit.entry
    return found


@pytest.mark.slow  # four processes
def test_four_processes_leave_the_fused_entries_of_one(tmp_path):
    assert sorted(set().union(*SUBSETS)) == list(range(COUNT))
    finish(start_worker(tmp_path / "single", "-", "single", list(range(COUNT))))
    sync = tmp_path / "sync"
    sync.mkdir()
    # Every worker opens the store (and reads its then empty catalog) before any ingests: a worker
    # that never re-reads the catalog fuses with its own 9 chunks only, whatever the timing.
    workers = [start_worker(tmp_path / "shared", sync, str(w), subset) for w, subset in enumerate(SUBSETS)]
    deadline = time.monotonic() + 300
    while len(list(sync.glob("ready-*"))) < len(workers):
        assert time.monotonic() < deadline and all(w.poll() is None for w in workers), "a worker did not start"
        time.sleep(0.05)
    (sync / "go").touch()
    for process in workers:
        finish(process)

    expected, shared = fused_entries(tmp_path / "single"), fused_entries(tmp_path / "shared")
    wrong = [n for n in range(COUNT) if shared[n].meta["neighbours"] != expected[n].meta["neighbours"]]
    assert not wrong, f"chunks {wrong} have other neighbours than one process gives them"
    assert all(shared[n].bitwise_equal(expected[n]) for n in range(COUNT))
    assert all(len(expected[n].meta["neighbours"]) == NEIGHBOURS for n in range(COUNT))

    again = FusionRAG.from_pretrained("tiny", store=tmp_path / "shared", options={"prefix_cache": False})
    report = again.add_chunks([text_of(n) for n in range(COUNT)], neighbors=NEIGHBOURS, embeddings=VECTORS)
    assert (report.plain_computed, report.fused_computed) == (0, 0)


# ---------------------------------------------------------------------- the races, replayed in order
X, Z, Y = "Chunk X: the ferry leaves at noon.", "Chunk Z: the lighthouse is red.", "Chunk Y: the ferry leaves at one."
# Before Y exists, X and Z are each other's only neighbour; then Y is the nearest of both.
VX, VZ, VY = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.9, 0.1, 0.0]


def neighbour_texts(rag: FusionRAG, text: str) -> list[str]:
    entry = rag.stored(chunk_id_of(text), "fused").entry
    return [{chunk_id_of(t): t for t in (X, Y, Z)}[chunk_id] for chunk_id in entry.meta["neighbours"]]


def test_a_chunk_registered_later_by_another_process_refreshes_earlier_fused_entries(tmp_path):
    first = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False})
    first.add_chunks([X, Z], neighbors=1, embeddings=[VX, VZ])
    second = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False})
    report = second.add_chunks([Y], neighbors=1, embeddings=[VY])
    assert neighbour_texts(second, X) == [Y] and neighbour_texts(second, Z) == [Y]  # not asked for, but stale
    assert report.fused_computed == 3  # Y; X and Z, whose nearest is now Y
    assert first.add_chunks([X, Z], neighbors=1, embeddings=[VX, VZ]).fused_computed == 0


def test_an_entry_computed_from_an_older_view_is_computed_again_after_it_is_written(tmp_path, monkeypatch):
    first = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False})
    second = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False})
    compute_fused = EntryComputer.compute_fused
    seen = {}

    def other_process_meanwhile(self, token_ids, neighbours, neighbour_ids, **options):
        # While the first engine computes X after Z, the second registers Y (closer to X) and
        # finishes; X has no record yet, so only the first engine can still put X right.
        if self is first.engine.computer and "second" not in seen:
            seen["second"] = second.add_chunks([Y], neighbors=1, embeddings=[VY])
        elif self is first.engine.computer and token_ids == first.chunks[chunk_id_of(Z)].token_ids:
            seen["X when Z starts"] = neighbour_texts(first, X)  # right away, not only at the end
        return compute_fused(self, token_ids, neighbours, neighbour_ids, **options)

    monkeypatch.setattr(EntryComputer, "compute_fused", other_process_meanwhile)
    first.add_chunks([X, Z], neighbors=1, embeddings=[VX, VZ])
    assert seen["X when Z starts"] == [Y]
    assert neighbour_texts(first, X) == [Y] and neighbour_texts(first, Z) == [Y]
