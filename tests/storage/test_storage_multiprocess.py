"""Several processes on one store directory: persistence, concurrent use, a writer killed midway."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from storage_testutil import key_for, make_entry

from fusionrag_llm.storage import StoreBudgets, StoreOptions, TieredStore

pytestmark = pytest.mark.slow  # other processes (see pyproject.toml)

HERE = Path(__file__).resolve().parent
OPTIONS = StoreOptions(disk_min_file_bytes=16 * 1024)  # entries of 300 tokens become files
PRELUDE = """
import json, sys, time
from pathlib import Path
from storage_testutil import key_for, make_entry
from fusionrag_llm.storage import StoreBudgets, StoreOptions, TieredStore
OPTIONS = StoreOptions(disk_min_file_bytes=16 * 1024)
"""


def _size(seed: int) -> int:
    return 300 if seed % 2 else 4  # alternate file-backed and db-backed entries


def _spawn(code: str, *args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    script = PRELUDE + textwrap.dedent(code)
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, **kwargs,
    )


def _run(code: str, *args: str, timeout: float = 60) -> str:
    proc = _spawn(code, *args)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


def test_a_new_process_sees_the_entries(tmp_path):
    directory = tmp_path / "store"
    with TieredStore(directory, options=OPTIONS) as store:
        for seed in range(8):
            store.put(key_for(seed, _size(seed)), make_entry(seed, _size(seed)))
    out = _run(
        """
        size = lambda seed: 300 if seed % 2 else 4
        with TieredStore(sys.argv[1], options=OPTIONS) as store:
            good = 0
            for seed in range(8):
                entry, tier = store.get(key_for(seed, size(seed)))
                good += tier == "disk" and entry.bitwise_equal(make_entry(seed, size(seed)))
            store.put(key_for(50), make_entry(50))
        print(good)
        """,
        str(directory),
    )
    assert out.strip() == "8"
    with TieredStore(directory, options=OPTIONS) as store:
        assert store.get(key_for(50))[0].bitwise_equal(make_entry(50))


WORKER = """
worker, directory, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
size = lambda seed: 300 if seed % 2 else 4
go = Path(directory).parent / "go"
(Path(directory).parent / f"ready{worker}").touch()
while not go.exists():
    time.sleep(0.005)
bad = cross_hits = 0
with TieredStore(directory, StoreBudgets(host_bytes=4096), options=OPTIONS) as store:
    for j in range(count):
        for seed in (worker * 1000 + j, 5000 + j):  # own entries, and shared ones both write
            store.put(key_for(seed, size(seed)), make_entry(seed, size(seed)))
        for seed in ((1 - worker) * 1000 + j, 5000 + j // 2, worker * 1000 + j // 3):
            found = store.get(key_for(seed, size(seed)))
            bad += found is not None and not found[0].bitwise_equal(make_entry(seed, size(seed)))
            cross_hits += found is not None and seed // 1000 == 1 - worker
    print(json.dumps({"bad": bad, "corrupt": store.stats().corrupt, "cross_hits": cross_hits}))
"""


def test_two_processes_write_and_read_one_store_at_once(tmp_path):
    directory, count = tmp_path / "store", 40
    TieredStore(directory).close()  # create the db before the race
    workers = [_spawn(WORKER, str(w), str(directory), str(count)) for w in (0, 1)]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{w}").exists() for w in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.005)
    (tmp_path / "go").touch()  # both start their loops together
    results = []
    for proc in workers:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert [(r["bad"], r["corrupt"]) for r in results] == [(0, 0), (0, 0)]
    assert sum(r["cross_hits"] for r in results) > 0  # each read the other's fresh writes
    seeds = [w * 1000 + j for w in (0, 1) for j in range(count)] + [5000 + j for j in range(count)]
    with TieredStore(directory, options=OPTIONS) as store:
        assert len(store.keys()) == len(seeds)
        for seed in seeds:
            entry, _ = store.get(key_for(seed, _size(seed)))
            assert entry.bitwise_equal(make_entry(seed, _size(seed)))
        assert store.verify().ok


WRITER = """
directory, total = sys.argv[1], int(sys.argv[2])
with TieredStore(directory, options=OPTIONS) as store:
    written = skipped = 0
    for seed in range(total):
        key = key_for(seed, 300)
        if key in store:
            skipped += 1
            continue
        store.put(key, make_entry(seed, 300, layers=4))
        written += 1
        print(key, flush=True)
    print(f"done {written} {skipped}", flush=True)
"""


def test_writer_killed_midway_leaves_only_valid_entries_and_resumes(tmp_path):
    directory, total = tmp_path / "store", 1000
    proc = _spawn(WRITER, str(directory), str(total))
    completed = []
    deadline = time.monotonic() + 60
    while len(completed) < 25 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line or line.startswith("done"):
            break
        completed.append(line.strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # lines printed before the kill but not yet read: through the same reader, whose buffer may hold
    # lines ``readline`` read ahead (``communicate`` would read the pipe past that buffer)
    rest = proc.stdout.read()
    proc.stderr.close()
    if proc.returncode != -signal.SIGKILL or "done" in rest:
        pytest.fail(f"writer finished before it could be killed (rc {proc.returncode}); raise `total`")
    completed += rest.split()
    assert len(completed) >= 25
    with TieredStore(directory, options=OPTIONS) as store:
        assert store.verify().ok
        for seed, key in enumerate(completed):
            entry, tier = store.get(key)
            assert tier == "disk" and entry.bitwise_equal(make_entry(seed, 300, layers=4))
        stored = len(store.keys())
    assert stored in (len(completed), len(completed) + 1)  # at most the entry in flight at the kill
    out = _run(WRITER, str(directory), "60")
    written, skipped = map(int, out.strip().splitlines()[-1].split()[1:])
    assert skipped == stored and written == 60 - stored
