"""A process killed by SIGKILL while it ingests with Ray workers leaves none of the processes of the local
Ray cluster it started running (a real driver process, a real cluster, a real kill)."""

import os
import select
import signal
import subprocess
import sys
import time
import uuid

import pytest

pytest.importorskip("ray", reason="ingestion with workers needs Ray (pip install '.[distributed]')")
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads processes from /proc"), pytest.mark.slow]

TEST_MARK = "FUSIONRAG_TEST_DRIVER"  # every process the driver starts inherits it in its environment
GONE_WITHIN_S = 20.0

DRIVER = """
import sys

import numpy as np

from fusionrag_llm import FusionRAG
from fusionrag_llm.engine import ray_ingest

completed = ray_ingest._completed


def announced(ray, actors, method, batches, args):  # says when the workers finished a first batch
    for number, done in enumerate(completed(ray, actors, method, batches, args)):
        yield done
        if method == "plain" and number == 0:
            print("ingesting", flush=True)


ray_ingest._completed = announced
rag = FusionRAG.from_pretrained("tiny", store=sys.argv[1], options={"prefix_cache": False})
texts = [f"Chunk {n}: the mill of village {n} grinds {n * 13} sacks a day." for n in range(64)]
vectors = np.random.default_rng(5).standard_normal((len(texts), 16)).astype(np.float32)
rag.add_chunks(texts, neighbors=3, embeddings=vectors, workers=2)
"""


def test_a_killed_driver_leaves_no_ray_process_running(tmp_path):
    mark = uuid.uuid4().hex
    env = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}  # a local cluster
    env[TEST_MARK] = mark
    with open(tmp_path / "driver.log", "wb") as log:
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "store")], env=env,
                                  stdout=subprocess.PIPE, stderr=log)  # fmt: skip
    started = {}
    try:
        wait_for_line(driver, b"ingesting\n", tmp_path / "driver.log", timeout_s=120)
        started = {pid: start_time(pid) for pid in descendants(driver.pid)}
        assert any(command_of(pid).startswith("ray::IngestWorker") for pid in started), started
        driver.send_signal(signal.SIGKILL)
        assert driver.wait() == -signal.SIGKILL  # killed mid-ingestion, not ended on its own
        deadline = time.monotonic() + GONE_WITHIN_S
        while (left := running(started, mark)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"still running {GONE_WITHIN_S:.0f} s after the driver was killed: " + ", ".join(
            f"{pid} {command_of(pid)!r}" for pid in left)  # fmt: skip
    finally:
        for pid in running(started, mark):  # what a failed run left: only the processes this test started
            os.kill(pid, signal.SIGKILL)
        driver.kill()
        driver.wait()
        driver.stdout.close()


def wait_for_line(process: subprocess.Popen, line: bytes, log, timeout_s: float) -> None:
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    got = process.stdout.readline() if ready else b""
    assert got == line, f"the driver said {got!r}; its log ends with:\n{log.read_text()[-3000:]}"


def running(started: dict, mark: str) -> list[int]:
    """Processes that the driver started (its descendants when it was killed, or a process whose environment
    carries the test's mark) and that still run."""
    pids = {pid for pid, start in started.items() if start_time(pid) == start}
    pids |= {pid for pid in all_pids() if f"{TEST_MARK}={mark}".encode() in environ_of(pid)}
    return sorted(pid for pid in pids if state_of(pid) not in (None, "Z", "X"))


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        if (parent := parent_of(pid)) is not None:
            children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        new = set(children.get(todo.pop(), [])) - found
        found |= new
        todo += new
    return sorted(found)


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (the state first), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].decode().split()
    except OSError:
        return None


def state_of(pid: int) -> str | None:
    fields = stat_fields(pid)
    return fields[0] if fields else None


def parent_of(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[1]) if fields else None


def start_time(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 of stat: a pid reused later has another


def environ_of(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return environ.read().split(b"\0")
    except OSError:
        return []


def command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return ""
