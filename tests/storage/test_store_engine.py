"""The engine on a persistent tiered store: restarts, corruption, concurrency, interruption, isolation.

Stores here keep the compute dtype (kv_codec="model"): the tests count entry files and exact path hits
of the lossless layout; bf16 stores, the default of a new folder, are tested in test_store_codec_record.py."""

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.storage import StoreBudgets, TieredStore

WORKER = str(Path(__file__).with_name("store_worker.py"))
sys.path.insert(0, str(Path(__file__).parent))
from store_worker import chunks  # noqa: E402


def worker(folder, action, start, stop, **kwargs):
    return subprocess.run([sys.executable, WORKER, str(folder), action, str(start), str(stop)],
                          capture_output=True, text=True, **kwargs)  # fmt: skip


def result_of(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def file_of(folder: Path, key: str) -> Path:
    """The file of an entry's bytes (entries this size are files next to the index), named after its key."""
    (path,) = folder.rglob(f"{key}.val")
    return path


@pytest.mark.slow  # a second Python process
def test_a_new_process_gets_hits_and_identical_answers(tmp_path):
    first = result_of(worker(tmp_path, "both", 0, 6))
    assert first["plain_computed"] == 6
    second = result_of(worker(tmp_path, "both", 0, 6))
    assert second["plain_computed"] == 0
    assert second["path_hits"] == {"exact": 1, "chunk": 2, "miss": 0}  # the first chunk follows S0: exact
    assert second["tokens"] == first["tokens"]


def test_corrupt_entry_is_dropped_recomputed_and_reported(tmp_path, caplog):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "model", "prefix_cache": False})
    texts = chunks(0, 3)
    rag.add_chunks(texts, fuse=False, embeddings=[[1, 0], [0, 1], [1, 1]])
    request = RAGRequest(chunks=texts, question="How many boats?")
    clean = rag.generate(request, method="full_reuse", max_new_tokens=6)
    victim_key = rag.stored(chunk_id_of(texts[1]), "plain").key
    rag.store.close()
    victim = file_of(tmp_path, victim_key)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    reopened = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "model", "prefix_cache": False})
    with caplog.at_level(logging.WARNING):
        out = reopened.generate(request, method="full_reuse", max_new_tokens=6)
    assert "corrupt" in caplog.text
    assert out.stats.path_hits == {"exact": 1, "chunk": 1, "miss": 1}
    assert out.token_ids == clean.token_ids
    again = reopened.generate(request, method="full_reuse", max_new_tokens=6)
    assert again.stats.path_hits == {"exact": 1, "chunk": 2, "miss": 0}
    assert reopened.store.verify().corrupt == []


def test_truncated_entry_is_caught_by_verify(tmp_path):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "model"})
    rag.add_chunks(chunks(0, 3), fuse=False, embeddings=[[1, 0], [0, 1], [1, 1]])
    rag.store.close()
    victim = sorted(tmp_path.rglob("*.val"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    store = TieredStore(tmp_path)
    report = store.verify()
    assert len(report.corrupt) == 1 and report.checked >= 3
    assert len(store.keys()) == report.checked - 1


@pytest.mark.slow
def test_two_processes_ingest_and_read_one_store_at_once(tmp_path):
    procs = [subprocess.Popen([sys.executable, WORKER, str(tmp_path), "both", str(a), str(b)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
             for a, b in ((0, 12), (6, 18))]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1500:] for o in outputs]
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "model"})
    assert rag.store.verify().corrupt == []
    report = rag.add_chunks(chunks(0, 18), fuse=False, embeddings=[[1.0, float(i % 5), float(i % 3)] for i in range(18)])
    assert report.plain_computed == 0  # every entry either process wrote is there and readable
    assert len(rag.chunks) == 18


@pytest.mark.slow
def test_killed_ingestion_keeps_completed_entries_and_resumes(tmp_path):
    process = subprocess.Popen([sys.executable, WORKER, str(tmp_path), "ingest", "0", "400"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.time() + 240
    while time.time() < deadline and len(list(tmp_path.rglob("*.val"))) < 20:
        time.sleep(0.2)
    process.kill()
    process.wait()
    assert 20 <= len(list(tmp_path.rglob("*.val"))) < 400, "the ingestion was not interrupted midway"
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "model"})
    assert rag.store.verify().corrupt == []
    stored = len([k for k in rag.store.keys()]) - 1  # minus the prefix entry
    report = rag.add_chunks(chunks(0, 400), fuse=False, embeddings=[[1.0, float(i % 5), float(i % 3)] for i in range(400)])
    assert report.plain_computed == 400 - stored


@pytest.mark.parametrize("other", [dict(name="tiny-qwen2"), dict(name="tiny", dtype="bfloat16")])
def test_another_model_or_dtype_never_reads_these_entries(tmp_path, other):
    texts = chunks(0, 3)
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "model"})
    rag.add_chunks(texts, fuse=False, embeddings=[[1, 0], [0, 1], [1, 1]])
    rag.store.close()
    stranger = FusionRAG.from_pretrained(other["name"], dtype=other.get("dtype"), store=tmp_path)
    out = stranger.generate(RAGRequest(chunks=texts, question="q?"), method="full_reuse", max_new_tokens=2)
    assert out.stats.path_hits == {"exact": 0, "chunk": 0, "miss": 3}


def test_alternative_path_exact_hit_then_chunk_entries_for_another_order(tmp_path):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "model"})
    texts = chunks(0, 3)
    rag.add_chunks(texts, embeddings=[[1, 0], [0, 1], [1, 1]], neighbors=2)
    request = RAGRequest(chunks=texts, question="How many ferries?")
    full = rag.generate(request, method="full_attention", max_new_tokens=8)
    full_logits = rag.logits(request, full.token_ids, method="full_attention")
    again = rag.generate(request, method="fusionrag", recompute_ratio=0.15, max_new_tokens=8)
    assert again.stats.path_hits == {"exact": 3, "chunk": 0, "miss": 0}
    assert again.stats.reused_tokens == 0 and again.token_ids == full.token_ids
    assert (rag.logits(request, full.token_ids) - full_logits).abs().max().item() <= 1e-4
    shuffled = rag.generate(RAGRequest(chunks=texts[::-1], question="How many ferries?"), method="fusionrag", max_new_tokens=2)
    assert shuffled.stats.path_hits == {"exact": 1, "chunk": 2, "miss": 0}  # the first one: its plain entry
    assert shuffled.stats.variant_hits == {"fused": 2, "plain": 0}
    prefix_shared = rag.generate(RAGRequest(chunks=texts[:2] + [texts[0]], question="How many ferries?"), max_new_tokens=2)
    assert prefix_shared.stats.path_hits == {"exact": 2, "chunk": 1, "miss": 0}


def test_fp16_codec_on_disk_while_computing_in_float32(tmp_path):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "fp16"})
    texts = chunks(0, 2)
    rag.add_chunks(texts, fuse=False, embeddings=[[1, 0], [0, 1]])
    entry = rag.stored(chunk_id_of(texts[0]), "plain").entry
    assert str(entry.keys.dtype) == "torch.float16"
    out = rag.generate(RAGRequest(chunks=texts, question="q?"), method="full_reuse", max_new_tokens=3)
    assert out.stats.path_hits == {"exact": 0, "chunk": 2, "miss": 0}  # float16 KV is never served as exact


def test_host_budget_is_respected_by_the_engine(tmp_path):
    store = TieredStore(tmp_path, StoreBudgets(host_bytes=150_000, disk_bytes=10**9))
    rag = FusionRAG.from_pretrained("tiny", store=store, options={"kv_codec": "model"})
    texts = chunks(0, 10)
    rag.add_chunks(texts, embeddings=[[1.0, float(i)] for i in range(10)], neighbors=2)
    for start in range(0, 8):
        rag.generate(RAGRequest(chunks=texts[start : start + 3], question="q?"), max_new_tokens=1)
        assert store.stats().tiers["host"].bytes <= 150_000


def test_generate_many_prefetches_from_disk_and_matches_one_by_one(tmp_path):
    texts = chunks(0, 8)
    FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "model"}).add_chunks(texts, embeddings=[[1.0, float(i)] for i in range(8)], neighbors=2)
    requests = [RAGRequest(chunks=texts[i : i + 3], question=f"How many boats in town {i}?") for i in range(5)]
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "model"})  # a fresh process view: entries only on disk
    batch = rag.generate_many(requests, max_new_tokens=4)
    assert batch[0].stats.tier_hits["disk"] >= 3 and all(g.stats.prefetched_entries >= 3 for g in batch)
    single = [rag.generate(r, max_new_tokens=4) for r in requests]
    assert [g.token_ids for g in batch] == [g.token_ids for g in single]
