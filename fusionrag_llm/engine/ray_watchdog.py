"""A watchdog process that kills the processes a call started (a local Ray cluster) once the calling
process ends, even when it is killed by SIGKILL.

Ray ties only the processes ``ray.init`` starts itself (GCS server, raylet, ...) to the calling
process (``PR_SET_PDEATHSIG``). The raylet's agents and workers notice that the raylet is gone by
polling: an agent then reports to the GCS, gone too, and runs on for a minute and more; a worker
finishes its batch, writing entries into the store, and runs on for as long as nobody reaps the
raylet (a container whose first process reaps no orphans). So the processes started under
``Watchdog.marking()`` carry a token in their environment, which every process they start inherits,
and a process started beforehand waits for the caller to end (its pipe from the caller reaches end of
file, or it gets another parent) and then SIGKILLs every process of the machine that carries the token.
While it waits it also notes the marked processes it sees (pid and start time), and kills those too:
a process that retitles itself (Ray's agents do, through setproctitle) may overwrite the environment
that ``/proc`` shows, the token with it.

Linux only (it reads ``/proc``); elsewhere ``Watchdog`` starts nothing. This file runs as the
watchdog with the standard library only: ``python -I ray_watchdog.py TOKEN CALLER_PID``.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress

logger = logging.getLogger(__name__)
MARK = "FUSIONRAG_RAY_CLUSTER"  # the environment variable that carries the token
POLL_S = 0.5  # how often the watchdog checks whether the caller is still its parent
KILL_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 30.0


class Watchdog:
    """Processes started under ``marking()`` end once this process ends, or when the watchdog closes.

    >>> with Watchdog() as watchdog:  # doctest: +SKIP
    ...     with watchdog.marking():
    ...         ray.init()
    ...     ...
    ...     ray.shutdown()  # closing the watchdog then kills whatever it left
    """

    def __init__(self):
        self.token = uuid.uuid4().hex
        self.process = _start(self.token)

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def marking(self) -> Iterator[None]:
        """Processes started in the body (and all they start) carry the token; meant to be brief, as
        a process another thread starts meanwhile carries it too."""
        if self.process is None:
            yield
            return
        before = os.environ.get(MARK)
        os.environ[MARK] = self.token
        try:
            yield
        finally:
            if before is None:
                del os.environ[MARK]
            else:
                os.environ[MARK] = before

    def close(self) -> None:
        """Kill the marked processes that still run and wait until the watchdog has done so."""
        if self.process is None:
            return
        self.process.stdin.close()  # end of file: the watchdog kills, as when this process dies
        try:
            self.process.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("the watchdog of the local Ray cluster (process %s) did not end within %.0f s",
                           self.process.pid, CLOSE_TIMEOUT_S)  # fmt: skip
        self.process = None


def _start(token: str) -> subprocess.Popen | None:
    if not sys.platform.startswith("linux") or not os.path.exists("/proc/self/environ") or not sys.executable:
        logger.debug("no watchdog for the local Ray cluster on %s", sys.platform)
        return None
    command = [sys.executable, "-I", os.path.abspath(__file__), token, str(os.getpid())]
    try:
        # a session of its own: Ctrl-C or a hang-up in the terminal reaches the caller, not the watchdog
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        logger.warning("could not start the watchdog of the local Ray cluster (%s): its processes may outlive "
                       "this one if it is killed", exc)  # fmt: skip
        return None


def watch(token: str, caller: int) -> None:
    """The watchdog: wait until the caller ends (or closes the pipe), noting the marked processes it sees,
    then kill the marked processes and the noted ones."""
    seen: dict[int, int] = {}  # pid -> its start time
    while os.getppid() == caller:  # another parent: the caller died (a process it forked may hold the pipe)
        readable, _, _ = select.select([sys.stdin], [], [], POLL_S)
        seen.update((pid, start) for pid in marked_processes(token) if (start := start_time(pid)) is not None)
        if readable:
            break  # the caller never writes: readable means end of file
    kill_marked(token, seen)


def kill_marked(token: str, seen: dict[int, int] | None = None, timeout_s: float = KILL_TIMEOUT_S) -> None:
    """SIGKILL every process of this machine whose environment carries ``token``, and those of ``seen``
    (pid -> start time) that still run, until none is left (a process may start another before it is
    killed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        noted = [pid for pid, start in (seen or {}).items() if start_time(pid) == start]
        found = 0
        for pid in [*noted, *marked_processes(token)]:  # each killed as soon as found: a worker may be writing
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            found += 1
        if not found:
            return
        time.sleep(0.01)


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot), or None when it is gone or a zombie: a pid
    used again later names another process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def marked_processes(token: str) -> Iterator[int]:
    """Processes whose environment carries ``token`` (an ended process not yet reaped has none)."""
    entry = f"{MARK}={token}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as environ:
                marked = entry in environ.read().split(b"\0")
        except OSError:  # ended meanwhile, or another user's
            continue
        if marked:
            yield int(name)


if __name__ == "__main__":
    watch(sys.argv[1], int(sys.argv[2]))
