"""The watchdog kills the processes started under ``marking()`` (and only those) when it closes or when
the process that started it dies, killed or not (real processes, no Ray)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from fusionrag_llm.engine import ray_watchdog
from fusionrag_llm.engine.ray_ingest import process_ended
from fusionrag_llm.engine.ray_watchdog import MARK, Watchdog, marked_processes

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the watchdog reads /proc")
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]

CALLER = """
import os, subprocess, sys, time
from fusionrag_llm.engine.ray_watchdog import Watchdog

watchdog = Watchdog()
with watchdog.marking():
    marked = subprocess.Popen({sleeper!r})
forked = os.fork() if {fork} else 0  # a child that holds the pipe to the watchdog open
if forked == 0 and {fork}:
    time.sleep(60)
print(marked.pid, forked, watchdog.process.pid, flush=True)
time.sleep(60)
"""


@linux_only
def test_closing_kills_the_processes_started_while_marking_and_no_other():
    with Watchdog() as watchdog:
        with watchdog.marking():
            marked = subprocess.Popen(SLEEPER)
        unmarked = subprocess.Popen(SLEEPER)
        assert MARK not in os.environ
        assert list(marked_processes(watchdog.token)) == [marked.pid]
    try:
        assert watchdog.process is None  # it waited for the watchdog to end
        assert marked.wait(timeout=10) == -signal.SIGKILL
        assert unmarked.poll() is None
    finally:
        unmarked.kill()
        marked.kill()


@linux_only
@pytest.mark.parametrize("fork", [False, True], ids=["pipe-closed", "pipe-held-by-a-fork"])
def test_a_killed_caller_takes_the_marked_processes_with_it(fork):
    """The watchdog sees its caller die at the end of its pipe, or, while a process the caller forked
    holds the pipe, at its new parent."""
    caller = subprocess.Popen([sys.executable, "-c", CALLER.format(sleeper=SLEEPER, fork=fork)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    marked, forked, watchdog = map(int, caller.stdout.readline().split())
    try:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
        deadline = time.monotonic() + 10
        while not (process_ended(marked) and process_ended(watchdog)):
            assert time.monotonic() < deadline, "the marked process or the watchdog still runs"
            time.sleep(0.02)
        assert not fork or not process_ended(forked)  # unmarked: it lives on
    finally:
        for pid in (marked, forked, watchdog):
            if pid and not process_ended(pid):
                os.kill(pid, signal.SIGKILL)


def test_elsewhere_than_linux_nothing_is_started(monkeypatch):
    monkeypatch.setattr(ray_watchdog.sys, "platform", "darwin")
    with Watchdog() as watchdog:
        with watchdog.marking():
            assert MARK not in os.environ
        assert watchdog.process is None
