"""A real server on a loopback port: uvicorn running the app in a thread, the tiny model behind it."""

import threading
import time
from types import SimpleNamespace

import pytest

uvicorn = pytest.importorskip("uvicorn")

CHUNKS = [
    "The lighthouse at Carrow Point was lit for the first time in 1862.",
    "Its keeper, Tomas Vell, kept a log of every ship that passed the point.",
    "The log was lost in the harbour fire of 1901 with the rest of the archive.",
]


class RunningServer:
    def __init__(self, app):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def make_rag():
    from fusionrag_llm import FusionRAG

    rag = FusionRAG.from_pretrained("tiny", store=":memory:")
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.8, 0.6], [0, 1]], neighbors=1)
    return rag
