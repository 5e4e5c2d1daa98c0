"""Chunk registration over HTTP does not hold up other clients: while one client registers many chunks,
another client's chat is answered between two of its entries, long before the registration ends."""

import hashlib
import threading
import time

import httpx
import numpy as np

from fusionrag_llm import FusionRAG
from fusionrag_llm.server.app import create_app

from server_helpers import RunningServer

TEXTS = [
    f"Entry {i} of the harbour log: the ship {i * 7} passed the point at dawn with grain and salt." for i in range(80)
]


def hashed_embedding(texts):  # a cheap stand-in for the embedding model: registration time is entries
    return np.array([[b - 127.5 for b in hashlib.sha256(t.encode()).digest()[:8]] for t in texts], dtype=np.float32)


def test_a_chat_is_answered_while_another_client_registers_chunks():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", embedder=hashed_embedding)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Who kept the log?"}], "max_tokens": 2}
    finished = {}
    with RunningServer(create_app(rag, "tiny")) as base:
        httpx.post(f"{base}/v1/chat/completions", json=chat, timeout=60).raise_for_status()  # warm

        def register():
            response = httpx.post(f"{base}/v1/chunks", json={"texts": TEXTS, "neighbors": 2}, timeout=300)
            finished["registration"] = (time.monotonic(), response)

        registering = threading.Thread(target=register)
        registering.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{base}/health").json()["registering"] == 0 and "registration" not in finished:
            assert time.monotonic() < deadline, "the registration did not start"
            time.sleep(0.01)
        assert "registration" not in finished, "the registration ended before the chat was sent"
        reply = httpx.post(f"{base}/v1/chat/completions", json=chat, timeout=300)
        chat_done = time.monotonic()
        registering.join(timeout=300)
    done_at, response = finished["registration"]
    assert reply.status_code == 200 and response.status_code == 200, (reply.text, response.text)
    assert response.json()["plain_computed"] == len(TEXTS) and response.json()["fused_computed"] >= len(TEXTS)
    assert chat_done < done_at, "the chat waited for the whole registration"
