"""A damaged, read-only or full store never stops queries and stops ingestion with one clear error.

The chunk catalog (``catalog.jsonl``) may hold a non-UTF-8 byte, garbage or a torn last line: those
lines are skipped with a warning naming them, the rest loads. A store whose catalog cannot be written
is still opened and queried. A store write that fails mid-ingestion says what was kept.
"""

import builtins
import errno
import logging

import numpy as np
import pytest

from fusionrag_llm import FusionRAG, FusionRAGError, RAGRequest
from fusionrag_llm.fusion.catalog import CATALOG_FILE, chunk_id_of, registered_chunk_count
from fusionrag_llm.storage import StoreWriteError

TEXTS = [f"Passage {i}: the harbour of town {i} holds {i * 7} boats each day." for i in range(5)]
VECTORS = [[1.0, float(i), float(i % 2)] for i in range(5)]


def ingested_store(folder, texts=TEXTS, vectors=VECTORS):
    rag = FusionRAG.from_pretrained("tiny", store=folder, options={"prefix_cache": False})
    rag.add_chunks(texts, neighbors=2, embeddings=vectors)
    return folder


def open_rag(folder):
    return FusionRAG.from_pretrained("tiny", store=folder, options={"prefix_cache": False})


# ---------------------------------------------------------------------- damaged lines
def test_bad_lines_are_skipped_with_their_line_numbers(tmp_path, caplog):
    folder = ingested_store(tmp_path)
    path = folder / CATALOG_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    assert lines[0].startswith(b'{"text": "Passage 0') and lines[1].startswith(b'{"text": "Passage 1')
    lines[1] = lines[1].replace(b"harbour", b"h\xffrbour")  # a non-UTF-8 byte inside TEXTS[1]
    extra = [b"\xff\xfe\x00 not text at all\n", b"{not json\n", b"[1, 2, 3]\n", b'{"text": "", "vector": [1]}\n',
             b'{"fused": "k", "chunk": 3, "count": 1}\n']  # fmt: skip
    path.write_bytes(b"".join(lines[:1] + extra + lines[1:]) + b'{"text": "torn writ')  # extra: lines 2 to 6
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.fusion.catalog"):
        rag = open_rag(folder)
    assert {t for t in TEXTS if chunk_id_of(t) in rag.chunks} == set(TEXTS) - {TEXTS[1]}
    warned = [r.getMessage() for r in caplog.records if "skipping line" in r.getMessage()]
    assert [int(message.split()[2]) for message in warned] == [2, 3, 4, 5, 6, 7], warned
    assert "not UTF-8" in warned[0] and "not JSON" in warned[1] and "not UTF-8" in warned[5]
    out = rag.generate(RAGRequest(chunks=[TEXTS[0], TEXTS[2]], question="How many boats?"), max_new_tokens=2)
    assert out.stats.path_hits["miss"] == 0  # the readable chunks' entries are served


def test_a_torn_last_line_does_not_swallow_the_next_registration(tmp_path):
    folder = ingested_store(tmp_path, TEXTS[:2], VECTORS[:2])
    with open(folder / CATALOG_FILE, "ab") as handle:
        handle.write(b'{"text": "a writer killed mid-wri')
    open_rag(folder).add_chunks(TEXTS[2:4], neighbors=2, embeddings=VECTORS[2:4])
    reopened = open_rag(folder)
    assert all(chunk_id_of(t) in reopened.chunks for t in TEXTS[:4])
    assert registered_chunk_count(folder) == 4


# ---------------------------------------------------------------------- a catalog that cannot be written
@pytest.fixture(params=[errno.EROFS, errno.EACCES, errno.EPERM], ids=["EROFS", "EACCES", "EPERM"])
def unwritable_catalog(request, monkeypatch):
    from fusionrag_llm.storage import record_log as record_log_module

    """Call it to make opening the catalog for writing fail as on a read-only mount (as root, chmod would not)."""

    def refusing_open(file, mode="r", *args, **kwargs):
        if any(flag in mode for flag in "wax+"):
            raise OSError(request.param, "simulated: " + errno.errorcode[request.param], str(file))
        return builtins.open(file, mode, *args, **kwargs)

    def make_unwritable() -> int:
        monkeypatch.setattr(record_log_module, "open", refusing_open, raising=False)  # the catalog's file
        return request.param

    return make_unwritable


def test_a_read_only_catalog_is_read_and_queried_and_refuses_new_chunks_clearly(tmp_path, unwritable_catalog):
    folder = ingested_store(tmp_path)
    code = unwritable_catalog()
    rag = open_rag(folder)
    out = rag.generate(RAGRequest(chunks=TEXTS[:3], question="How many boats?"), max_new_tokens=2)
    assert out.stats.path_hits["miss"] == 0 and len(rag.chunks) == len(TEXTS)
    assert rag.add_chunks(TEXTS, neighbors=2, embeddings=VECTORS).fused_computed == 0  # nothing to write: fine
    with pytest.raises(FusionRAGError) as caught:
        rag.add_chunks(["A new passage about the lighthouse of the town."], embeddings=[[0.0, 1.0, 0.0]])
    message = str(caught.value)
    assert str(folder) in message and errno.errorcode[code] in message
    assert "can still be opened and queried" in message


# ---------------------------------------------------------------------- a store write that fails
def failing_after(rag, allowed: int, calls: list):
    """``rag.store.put`` that stores ``allowed`` checked entries, then fails like a full disk."""
    real_put = rag.store.put

    def put(key, entry, *, persist=False, **options):
        calls.append(persist)
        if persist and sum(calls) > allowed:
            raise StoreWriteError(rag.store.directory, key, OSError(errno.ENOSPC, "No space left on device"))
        return real_put(key, entry, persist=persist, **options)

    return put


def test_a_full_disk_stops_ingestion_with_one_error_saying_what_was_kept(tmp_path, monkeypatch):
    rag = open_rag(tmp_path)
    calls: list[bool] = []
    monkeypatch.setattr(rag.store, "put", failing_after(rag, allowed=3, calls=calls))
    with pytest.raises(FusionRAGError) as caught:
        rag.add_chunks(TEXTS, neighbors=2, embeddings=VECTORS)
    message = str(caught.value)
    assert str(tmp_path) in message and "No space left on device" in message
    assert "3 plain and 0 fused entries" in message and "run the same call again" in message
    assert isinstance(caught.value.__cause__, StoreWriteError)
    monkeypatch.undo()
    resumed = rag.add_chunks(TEXTS, neighbors=2, embeddings=VECTORS)
    assert (resumed.plain_computed, resumed.fused_computed) == (len(TEXTS) - 3, len(TEXTS))


def test_entry_writes_are_checked_only_where_there_is_a_disk(tmp_path, monkeypatch):
    for store, checked in ((tmp_path, 4), (":memory:", 0)):  # 2 plain + 2 fused entries on disk
        rag = open_rag(store)
        calls: list[bool] = []
        monkeypatch.setattr(rag.store, "put", failing_after(rag, allowed=10**6, calls=calls))
        rag.add_chunks(TEXTS[:2], neighbors=1, embeddings=VECTORS[:2])
        assert calls.count(True) == checked and len(calls) >= 4
