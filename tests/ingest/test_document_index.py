"""The retrieval index of `fusionrag ingest` lives in the store's record log ``documents.jsonl``.

It travels with the store (a file in its folder, or in memory with a ":memory:" store, shared by
every engine on that store), skips bad lines, survives torn ones, and stores written with the older
``documents/`` folder are moved into the log once (or read from the folder when they cannot be).
"""

import errno
import json
import logging

import numpy as np
import pytest

from fusionrag_llm import FusionRAG, FusionRAGError
from fusionrag_llm.ingest.doc_index import (
    DOCUMENTS_LOG,
    LEGACY_FOLDER,
    DocumentIndex,
    DocumentIndexWriteError,
    IndexMeta,
)
from fusionrag_llm.ingest.pipeline import answer, document_index, ingest_paths
from fusionrag_llm.storage import FileRecordLog, MemoryRecordLog

META = IndexMeta("tiny", "fp-tiny", "given", 3)
UNIT = np.eye(3, dtype=np.float32)


def file_index(folder, legacy=None):
    return DocumentIndex(FileRecordLog(folder, DOCUMENTS_LOG), legacy=legacy)


def test_bad_lines_are_skipped_and_a_torn_one_never_swallows_the_next_append(tmp_path, caplog):
    index = file_index(tmp_path)
    index.check_meta(META)
    index.add(["alpha text", "beta text"], ["a.md", "b.md"], UNIT[:2])
    log = tmp_path / DOCUMENTS_LOG
    meta, alpha, beta = log.read_bytes().splitlines(keepends=True)
    short = json.dumps({"text": "short", "source": "s.md", "vector": [1.0]}).encode() + b"\n"
    log.write_bytes(meta + alpha.replace(b"alpha", b"\xffalpha") + short + beta + b'{"text": "torn')
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.ingest.doc_index"):
        reopened = file_index(tmp_path)
    assert reopened.texts == ["beta text"] and reopened.meta == META
    assert "skipping line 2" in caplog.text and "not UTF-8" in caplog.text
    assert "skipping line 3" in caplog.text and "has 1 numbers, the index 3" in caplog.text
    reopened.add(["gamma text", "beta text"], ["c.md", "again.md"], UNIT[[2, 1]])
    again = file_index(tmp_path)
    assert again.texts == ["beta text", "gamma text"] and again.sources == ["b.md", "c.md"]


def test_two_writers_on_one_log_see_the_same_chunks_in_the_same_order(tmp_path):
    first, second = file_index(tmp_path), file_index(tmp_path)
    first.check_meta(META)
    second.check_meta(META)  # reads the first writer's meta instead of writing its own
    first.add(["a", "b"], ["1", "1"], UNIT[:2])
    second.add(["b", "c"], ["2", "2"], UNIT[1:])  # "b" is already there: only "c" is appended
    first.refresh()
    assert first.texts == second.texts == ["a", "b", "c"] and first.sources == ["1", "1", "2"]
    assert (tmp_path / DOCUMENTS_LOG).read_text().count("\n") == 4  # one meta and three chunks
    assert [t for t, _, _ in first.search(UNIT[2], 1)] == ["c"]


def test_another_model_or_embedding_space_is_refused(tmp_path):
    file_index(tmp_path).check_meta(META)
    with pytest.raises(FusionRAGError, match="was built with model 'tiny', not 'other'"):
        file_index(tmp_path).check_meta(IndexMeta("other", "fp-other", "given", 3))
    with pytest.raises(FusionRAGError, match=r"uses embeddings 'given' \(3-d\)"):
        file_index(tmp_path).check_meta(IndexMeta("tiny", "fp-tiny", "minilm", 384))


def test_a_store_that_cannot_be_written_is_searched_and_refuses_to_ingest_clearly(tmp_path, monkeypatch):
    index = file_index(tmp_path)
    index.check_meta(META)
    index.add(["alpha"], ["a.md"], UNIT[:1])

    def read_only(self):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(FileRecordLog, "appending", read_only)
    reopened = file_index(tmp_path)
    assert [t for t, _, _ in reopened.search(UNIT[0], 3)] == ["alpha"]
    with pytest.raises(DocumentIndexWriteError, match="read-only file system.*can still be queried"):
        reopened.add(["beta"], ["b.md"], UNIT[1:2])
    assert file_index(tmp_path).texts == ["alpha"]


def legacy_folder(store):
    """A store's index as the older layout kept it: meta.json, chunks.jsonl (a bad and a torn line), index.faiss."""
    folder = store / LEGACY_FOLDER
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps(META.__dict__))
    lines = [json.dumps({"text": t, "source": f"{t}.md", "vector": v.tolist()}) for t, v in zip("xyz", UNIT)]
    (folder / "chunks.jsonl").write_text(lines[0] + "\nnot json\n" + lines[1] + "\n" + lines[2][:9])
    (folder / "index.faiss").write_bytes(b"an index built from the lines")
    return folder


def test_an_older_documents_folder_moves_into_the_log_once(tmp_path):
    folder = legacy_folder(tmp_path)
    moved = file_index(tmp_path, legacy=folder)
    assert moved.texts == ["x", "y"] and moved.meta == META and not folder.exists()
    assert file_index(tmp_path).texts == ["x", "y"]  # the log alone holds it now
    moved.add(["w"], ["w.md"], UNIT[2:])
    assert file_index(tmp_path, legacy=folder).texts == ["x", "y", "w"]


@pytest.mark.parametrize("planted", ["the folder", "its chunk file"])
def test_an_older_folder_reached_through_a_link_is_never_read(tmp_path, planted):
    """A ``documents`` folder (or a file in it) that is a symlink to data outside the store is not
    moved into the log: the store folder is untrusted, and nothing outside it is read."""
    elsewhere = legacy_folder(tmp_path / "elsewhere")
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    store = tmp_path / "store"
    store.mkdir()
    if planted == "the folder":
        (store / LEGACY_FOLDER).symlink_to(elsewhere, target_is_directory=True)
    else:
        (store / LEGACY_FOLDER).mkdir()
        (store / LEGACY_FOLDER / "meta.json").write_text(json.dumps(META.__dict__))
        (store / LEGACY_FOLDER / "chunks.jsonl").symlink_to(elsewhere / "chunks.jsonl")
    index = file_index(store, legacy=store / LEGACY_FOLDER)
    assert index.texts == [] and file_index(store).texts == []
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before  # read by no one, removed by no one


def test_an_older_folder_is_read_in_place_when_the_log_cannot_be_written(tmp_path, monkeypatch, caplog):
    folder = legacy_folder(tmp_path)

    def read_only(self):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(FileRecordLog, "appending", read_only)
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.ingest.doc_index"):
        index = file_index(tmp_path, legacy=folder)
    assert index.texts == ["x", "y"] and index.meta == META and folder.is_dir()
    assert "it is read from there" in caplog.text and not (tmp_path / DOCUMENTS_LOG).exists()


def test_a_memory_store_keeps_the_index_for_every_engine_on_it(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "harbour.md").write_text("The harbour of Quennel holds forty boats.")
    (docs / "river.md").write_text("The Zorblat river flows north through Marovia.")
    writer = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    reader = FusionRAG.from_pretrained("tiny", store=writer.store, options={"prefix_cache": False})
    summary = ingest_paths(writer, [docs], neighbors=1, progress=False)
    assert (summary.new_chunks, summary.plain_computed, summary.fused_computed) == (2, 2, 2)
    assert len(document_index(reader)) == 2 and not list(tmp_path.glob("*.jsonl"))
    out, hits = answer(reader, "Which river flows through Marovia?", top_k=1, max_new_tokens=2)
    assert hits[0].source.endswith("river.md") and out.stats.path_hits["miss"] == 0 and out.stats.missed_tokens == 0
    other_store = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    with pytest.raises(FusionRAGError, match="is empty; run 'fusionrag ingest PATH' first"):
        answer(other_store, "Which river?", top_k=1)


def test_a_memory_log_works_like_a_file_log():
    log = MemoryRecordLog(DOCUMENTS_LOG)
    first, second = DocumentIndex(log), DocumentIndex(log)
    first.check_meta(META)
    first.add(["a"], ["1"], UNIT[:1])
    second.add(["b"], ["2"], UNIT[1:2])
    assert second.texts == ["a", "b"] and second.meta == META and second.where == "documents.jsonl (in memory)"


def _add_many(folder, worker):
    index = file_index(folder)
    index.check_meta(META)
    for start in range(0, 40, 4):
        texts = [f"chunk {n}" for n in range(start, start + 4)] + [f"worker {worker} chunk {start}"]
        index.add(texts, [f"w{worker}"] * len(texts), np.ones((len(texts), 3), dtype=np.float32))


def test_processes_appending_at_once_keep_every_chunk_once(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_add_many, args=(tmp_path, w)) for w in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    index = file_index(tmp_path)
    assert len(index) == 40 + 30 and len(set(index.texts)) == len(index.texts)
    assert (tmp_path / DOCUMENTS_LOG).read_text().count("\n") == 1 + 70  # one meta, no duplicate lines
