"""Engines sharing a remote KV tier on a real redis-server: what one process computed, the others load.

Each worker process has its own store folder and reaches the shared tier through $FUSIONRAG_REMOTE,
its values authenticated with $FUSIONRAG_REMOTE_SECRET (the worker is test_concurrent_ingest's,
unchanged); engines in this process pass the same secret as an option.
"""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.storage import remote_key_prefix

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from concurrent_ingest_worker import NEIGHBOURS, VECTORS, text_of  # noqa: E402

pytestmark = pytest.mark.slow  # other processes (see pyproject.toml)

WORKER = str(HERE.parent / "concurrent_ingest_worker.py")
CHUNKS = list(range(8))
SECRET = "the secret these engines share"
PREFIX = remote_key_prefix("fusionrag:kv:", SECRET)
SHARING = {"prefix_cache": False, "remote_secret": SECRET}


def ingest_in_a_process(folder: Path, url: str) -> dict:
    import json

    env = {**os.environ, "OMP_NUM_THREADS": "1", "FUSIONRAG_REMOTE": url, "FUSIONRAG_REMOTE_SECRET": SECRET}
    command = [sys.executable, WORKER, str(folder), "-", folder.name, ",".join(map(str, CHUNKS))]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_computes_nothing_and_a_corrupt_shared_entry_is_recomputed(tmp_path, redis_server):
    first = ingest_in_a_process(tmp_path / "first", redis_server.url)
    assert first == {"plain": len(CHUNKS), "fused": len(CHUNKS)}
    server = redis_server.client()
    assert server.hlen(PREFIX + "size") >= 2 * len(CHUNKS)  # plain and fused entries (and the prefix's)

    assert ingest_in_a_process(tmp_path / "second", redis_server.url) == {"plain": 0, "fused": 0}

    local = FusionRAG.from_pretrained("tiny", store=tmp_path / "first", options={"prefix_cache": False})
    token_ids = local.chunks[chunk_id_of(text_of(CHUNKS[2]))].token_ids
    victim = local.stored(token_ids, "plain").key
    data = bytearray(server.get(PREFIX + "e:" + victim))
    data[len(data) // 2] ^= 0x01
    server.set(PREFIX + "e:" + victim, bytes(data))
    third = FusionRAG.from_pretrained("tiny", store=tmp_path / "third", options={**SHARING, "remote": redis_server.url})
    assert third.stored(token_ids, "plain") is None  # detected: a miss, never served
    assert third.store.stats().corrupt == 1 and not server.exists(PREFIX + "e:" + victim)  # and dropped
    report = third.add_chunks([text_of(n) for n in CHUNKS], neighbors=NEIGHBOURS, embeddings=VECTORS[CHUNKS])
    assert (report.plain_computed, report.fused_computed) == (1, 0)  # recomputed, that entry only
    fifth = FusionRAG.from_pretrained("tiny", store=tmp_path / "fifth",
                                      options={**SHARING, "remote": redis_server.url})  # fmt: skip
    recomputed = fifth.stored(token_ids, "plain")
    assert recomputed.tier == "remote" and recomputed.entry.bitwise_equal(local.stored(token_ids, "plain").entry)
    assert ingest_in_a_process(tmp_path / "fourth", redis_server.url) == {"plain": 0, "fused": 0}


def ask(rag: FusionRAG) -> str:
    request = RAGRequest(chunks=[text_of(n) for n in CHUNKS[:3]], question="How many boats?")
    return rag.generate(request, method="fusionrag", max_new_tokens=4).text


def test_killing_the_server_mid_run_keeps_answering_from_local_tiers(tmp_path, redis_server, caplog):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path / "s", options={**SHARING, "remote": redis_server.url})
    assert rag.store.tier_names[-2:] == ["disk", "remote"]
    rag.add_chunks([text_of(n) for n in CHUNKS[:4]], neighbors=NEIGHBOURS, embeddings=VECTORS[CHUNKS[:4]])
    before = ask(rag)
    redis_server.kill()
    with caplog.at_level(logging.WARNING):
        report = rag.add_chunks([text_of(n) for n in CHUNKS], neighbors=NEIGHBOURS, embeddings=VECTORS[CHUNKS])
        assert ask(rag) == before
    assert report.plain_computed == len(CHUNKS) - 4  # the first four are still on the local disk
    assert "unreachable" in caplog.text
    assert rag.store.stats().tiers["disk"].entries >= 2 * len(CHUNKS)  # plain, fused (and the prefix)


def test_an_unreachable_url_at_start_is_logged_and_queries_answer(tmp_path, caplog):
    from redis_server import free_port

    with caplog.at_level(logging.WARNING):
        rag = FusionRAG.from_pretrained("tiny", store=tmp_path / "s",
                                        options={**SHARING, "remote": f"redis://127.0.0.1:{free_port()}/0"})  # fmt: skip
    assert "unreachable" in caplog.text
    rag.add_chunks([text_of(n) for n in CHUNKS[:3]], neighbors=2, embeddings=VECTORS[CHUNKS[:3]])
    assert ask(rag)
    local = FusionRAG.from_pretrained("tiny", store=tmp_path / "s", options={"prefix_cache": False})
    assert local.add_chunks([text_of(n) for n in CHUNKS[:3]], neighbors=2, embeddings=VECTORS[CHUNKS[:3]]).plain_computed == 0
