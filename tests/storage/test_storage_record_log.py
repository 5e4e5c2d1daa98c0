"""Record logs travel with a store: a file in its folder, or memory shared by one store object."""

import errno

import pytest

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.storage import FileRecordLog, MemoryRecordLog, StoreBudgets, TieredStore


@pytest.mark.parametrize("make", [lambda tmp: MemoryRecordLog("log.jsonl"), lambda tmp: FileRecordLog(tmp, "log.jsonl")],
                         ids=["memory", "file"])  # fmt: skip
def test_appends_are_read_back_and_a_torn_line_is_ended_first(tmp_path, make):
    log = make(tmp_path)
    assert log.read_from(0) == b""
    with log.appending() as session:
        end = session.append(b"one\n")
    with log.appending() as session:
        assert session.read_from(0) == b"one\n"
        session.append(b"torn")  # a writer killed mid-line
    with log.appending() as session:
        end = session.append(b"two\n")
    assert log.read_from(0) == b"one\ntorn\ntwo\n" and end == len(b"one\ntorn\ntwo\n")
    assert log.read_from(4) == b"torn\ntwo\n"


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".", "..", "x" * 65, 3])
def test_a_log_name_cannot_leave_the_store(name):
    store = TieredStore(None, StoreBudgets())
    with pytest.raises(ValueError, match="record log name"):
        store.record_log(name)


def test_a_log_file_that_is_a_link_is_never_followed(tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b'{"secret": 1}\n')
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "log.jsonl").symlink_to(outside)
    log = TieredStore(tmp_path / "store", StoreBudgets()).record_log("log.jsonl")
    with pytest.raises(OSError) as reading:
        log.read_from(0)
    with pytest.raises(OSError) as appending, log.appending() as session:
        session.append(b"written through the link\n")
    assert reading.value.errno == appending.value.errno == errno.ELOOP
    assert outside.read_bytes() == b'{"secret": 1}\n'


def test_a_folder_store_keeps_its_log_as_a_file_and_a_memory_store_in_memory(tmp_path):
    on_disk = TieredStore(tmp_path, StoreBudgets())
    assert on_disk.record_log("catalog.jsonl").path == tmp_path / "catalog.jsonl"
    in_memory = TieredStore(None, StoreBudgets())
    assert in_memory.record_log("catalog.jsonl") is in_memory.record_log("catalog.jsonl")
    assert in_memory.record_log("catalog.jsonl").path is None


def test_engines_on_one_memory_store_share_the_chunk_catalog():
    store = TieredStore(None, StoreBudgets())
    first = FusionRAG.from_pretrained("tiny", store=store)
    texts = ["The ferry to Osterholm leaves at nine every morning.", "Osterholm's harbour master is Lene Vik."]
    first.add_chunks(texts, embeddings=[[1.0, 0.0], [0.6, 0.8]], neighbors=1)
    second = FusionRAG.from_pretrained("tiny", store=store)
    assert len(second.chunks) == 2
    prompt = f"Context: {texts[0]}\n\n{texts[1]}\n\nWho is the harbour master?"
    out = second.generate(prompt, method="full_reuse", max_new_tokens=2)
    assert out.stats.path_hits["chunk"] + out.stats.path_hits["exact"] >= 1 and out.stats.path_hits["miss"] == 0
    again = second.generate(RAGRequest(chunks=texts, question="Who?"), method="fusionrag", max_new_tokens=2)
    assert again.stats.variant_hits["fused"] >= 1  # the fused entries the first engine computed
