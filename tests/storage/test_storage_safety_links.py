"""Links (and FIFOs) planted in a store folder are never followed: every file the store opens.

Anyone who can write the folder can replace any name the store uses with a symlink to a file outside
it (a shell start-up file, another user's data) or with a FIFO. Each test plants a real one, drives
the store, and checks that nothing outside changed and that the error (or the miss) says why. The
entry files and their sub-folders are covered in `test_storage_safety_untrusted.py`.
"""

import errno
import os
import sqlite3
import threading

import pytest
from storage_testutil import key_for, make_entry

from fusionrag_llm import FusionRAG
from fusionrag_llm.fusion.catalog import CATALOG_FILE, CatalogWriteError
from fusionrag_llm.fusion.request_variants import VARIANT_LOG
from fusionrag_llm.ingest.doc_index import DOCUMENTS_LOG
from fusionrag_llm.storage import StoreBudgets, StoreConfigError, StoreDamagedError, StoreOptions, TieredStore
from fusionrag_llm.storage.store_codec import CODEC_FILE, recorded_kv_codec

OPTIONS = StoreOptions(disk_min_file_bytes=16 * 1024)
LARGE = 300  # tokens: an entry with a file of its own under OPTIONS
PRECIOUS = b"export PATH=/usr/bin\n"


@pytest.fixture
def outside(tmp_path):
    """A file outside the store that no store operation may change."""
    path = tmp_path / "outside" / "profile"
    path.parent.mkdir()
    path.write_bytes(PRECIOUS)
    return path


def _untouched(outside):
    assert outside.read_bytes() == PRECIOUS and [p.name for p in outside.parent.iterdir()] == [outside.name]


def _in_thread(work, timeout_s=20.0):
    """Run `work` on a thread; fail (instead of hanging the suite) when it blocks."""
    done = {}
    thread = threading.Thread(target=lambda: done.update(result=_outcome(work)), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "blocked opening a FIFO planted in the store folder"
    return done["result"]


def _outcome(work):
    try:
        return work()
    except Exception as exc:  # noqa: BLE001 - the caller asserts on whatever it raised
        return exc


# ---------------------------------------------------------------------- record logs
@pytest.mark.parametrize("name", [CATALOG_FILE, VARIANT_LOG, DOCUMENTS_LOG])
def test_a_record_log_that_is_a_link_is_refused_naming_it(tmp_path, outside, name):
    store = TieredStore(tmp_path / "store", StoreBudgets())
    (tmp_path / "store" / name).symlink_to(outside)
    log = store.record_log(name)
    for action in (lambda: log.read_from(0), lambda: _append(log, b"echo pwned\n")):
        with pytest.raises(OSError) as refused:  # storage.UnsafePathError
            action()
        assert refused.value.errno == errno.ELOOP
        assert name in str(refused.value) and "symbolic link, which the store never follows" in str(refused.value)
    store.close()
    _untouched(outside)


def _append(log, data):
    with log.appending() as session:
        session.append(data)


def test_ingesting_into_a_store_whose_catalog_is_a_link_stops_with_a_clear_error(tmp_path, outside):
    folder = tmp_path / "store"
    FusionRAG.from_pretrained("tiny", store=folder).add_chunks(["Kept before the link."], embeddings=[[1.0, 0.0]])
    (folder / CATALOG_FILE).unlink()
    (folder / CATALOG_FILE).symlink_to(outside)
    rag = FusionRAG.from_pretrained("tiny", store=folder)
    with pytest.raises(CatalogWriteError, match="symbolic link, which the store never follows"):
        rag.add_chunks(["The ferry leaves at nine."], embeddings=[[0.0, 1.0]])
    _untouched(outside)


@pytest.mark.parametrize("name", [CATALOG_FILE, "kv_codec.json"])
def test_a_fifo_in_place_of_a_file_never_blocks_the_opener(tmp_path, name):
    folder = tmp_path / "store"
    folder.mkdir()
    os.mkfifo(folder / name)
    try:
        if name == CATALOG_FILE:
            log = TieredStore(folder, StoreBudgets()).record_log(name)
            refused = _in_thread(lambda: log.read_from(0))
            assert isinstance(refused, OSError) and "not a regular file" in str(refused)
            assert "not a regular file" in str(_in_thread(lambda: _append(log, b"x\n")))
        else:
            refused = _in_thread(lambda: recorded_kv_codec(folder))
            assert isinstance(refused, StoreConfigError) and "not a regular file" in str(refused)
    finally:  # a reader still blocked in open() (the bug) is released by a writer
        try:
            os.close(os.open(folder / name, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: no reader waits
            pass


# ---------------------------------------------------------------------- the index
@pytest.mark.parametrize("state", ["new store", "existing store"])
def test_a_journal_that_is_a_link_is_refused_and_never_read_or_written(tmp_path, outside, state):
    folder = tmp_path / "store"
    if state == "existing store":
        with TieredStore(folder, options=OPTIONS) as store:
            store.put(key_for(1), make_entry(1))
        con = sqlite3.connect(folder / "cache.db")  # a journal mode an attacker set: every write journals
        con.execute("PRAGMA journal_mode = DELETE")
        con.close()
    else:
        folder.mkdir()
    (folder / "cache.db-journal").symlink_to(outside)
    with pytest.raises(StoreDamagedError, match="cache.db-journal: it is a symbolic link"):
        TieredStore(folder, options=OPTIONS)
    _untouched(outside)
    assert (folder / "cache.db-journal").is_symlink()  # not removed behind the user's back either


@pytest.mark.parametrize("name", ["cache.db", "cache.db-wal", "cache.db-shm"])
def test_an_index_file_replaced_by_a_link_while_open_is_refused_by_every_new_connection(tmp_path, outside, name):
    folder = tmp_path / "store"
    store = TieredStore(folder, StoreBudgets(host_bytes=0), options=OPTIONS)
    assert store.put(key_for(1), make_entry(1))
    (folder / name).unlink()
    (folder / name).symlink_to(outside)
    refused = _in_thread(lambda: store.get(key_for(1)))  # a new thread opens a new connection
    assert isinstance(refused, StoreDamagedError) and f"{name}: it is a symbolic link" in str(refused)
    assert "cache verify --repair" in str(refused)
    store.close()
    _untouched(outside)


# ---------------------------------------------------------------------- entry sub-folders
def test_verify_reports_a_planted_sub_folder_link_and_repair_removes_only_the_link(tmp_path, outside):
    folder = tmp_path / "store"
    key = key_for(7, LARGE)
    with TieredStore(folder, StoreBudgets(host_bytes=0), options=OPTIONS) as store:
        assert store.put(key_for(1, LARGE), make_entry(1, LARGE))
        (folder / key[:2]).symlink_to(outside.parent, target_is_directory=True)
        assert not store.put(key, make_entry(7, LARGE))  # refused: no file lands outside
        assert store.stats().disk_write_failures == 1
        report = store.verify()
        assert report.orphan_files == [key[:2]] and not report.ok  # reported at once, no grace period
        assert store.verify(repair=True).orphan_files == [key[:2]]
        assert not os.path.lexists(folder / key[:2]) and store.verify().ok
        assert store.put(key, make_entry(7, LARGE)) and (folder / key[:2]).is_dir()
    _untouched(outside)


def test_a_write_through_a_sub_folder_link_names_the_link(tmp_path, outside, caplog):
    folder = tmp_path / "store"
    key = key_for(7, LARGE)
    with TieredStore(folder, StoreBudgets(host_bytes=0), options=OPTIONS) as store:
        (folder / key[:2]).symlink_to(outside.parent, target_is_directory=True)
        with pytest.raises(OSError, match=f"{key[:2]}: it is a symbolic link, which the store never follows"):
            store.put(key, make_entry(7, LARGE), persist=True)
    _untouched(outside)


# ---------------------------------------------------------------------- the store folder itself
def test_a_store_folder_that_is_a_link_the_user_chose_is_resolved_once(tmp_path):
    real = tmp_path / "disks" / "kv"
    real.mkdir(parents=True)
    (tmp_path / "kv").symlink_to(real, target_is_directory=True)
    with TieredStore(tmp_path / "kv", StoreBudgets(host_bytes=0), options=OPTIONS) as store:
        assert store.directory == real  # resolved at open: nothing below it is ever a link
        assert store.put(key_for(1, LARGE), make_entry(1, LARGE))
        assert store.record_log(CATALOG_FILE).path == real / CATALOG_FILE
    assert (real / "cache.db").is_file() and (real / key_for(1, LARGE)[:2]).is_dir()
    with TieredStore(tmp_path / "kv", StoreBudgets(host_bytes=0), options=OPTIONS) as store:
        assert store.get(key_for(1, LARGE))[0].bitwise_equal(make_entry(1, LARGE))


def test_the_codec_record_is_read_only_as_a_regular_file(tmp_path, outside):
    folder = tmp_path / "store"
    folder.mkdir()
    (folder / CODEC_FILE).symlink_to(outside)
    with pytest.raises(StoreConfigError, match="symbolic link, which the store never follows"):
        recorded_kv_codec(folder)
    _untouched(outside)
