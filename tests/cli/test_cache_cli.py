"""``fusionrag cache stats|verify|clear`` on damaged, incomplete and untidy stores: clear reports,
exit codes 0 (clean) / 1 (problems found), repair that keeps the damaged index aside."""

import os
import time

import pytest
import torch
from click.testing import CliRunner

from fusionrag_llm.cli.main import cli
from fusionrag_llm.models.fingerprint import model_digest
from fusionrag_llm.storage import KVEntry, StoreBudgets, StoreOptions, TieredStore, chunk_key, entry_files

FINGERPRINT = model_digest("tiny-cli-test", "float32")
OPTIONS = StoreOptions()  # the CLI's defaults: entries under 32 KiB live inside cache.db
SMALL, LARGE = [1, 2], [3, 4, 5]  # seeds of entries inside the db, and in files


def _tokens(seed: int) -> list[int]:
    return [100 * seed + i for i in range(600 if seed in LARGE else 4)]


def _key(seed: int) -> str:
    return chunk_key(FINGERPRINT, [1], _tokens(seed), "plain")


def _entry(seed: int) -> KVEntry:
    gen = torch.Generator().manual_seed(seed)
    shape = (2, 2, len(_tokens(seed)), 8)
    return KVEntry(_tokens(seed), torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def store(tmp_path):
    folder = tmp_path / "store"
    with TieredStore(folder, options=OPTIONS) as opened:
        for seed in SMALL + LARGE:
            assert opened.put(_key(seed), _entry(seed))
    lines = [b'{"text": "alpha", "vector": [1, 0]}', b"\xff\xfe not UTF-8 \xe9", b'{"text": "beta", "vector": [0, 1]}']
    (folder / "catalog.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return folder


def _file_of(folder, key):
    """An entry's file: named after its key (entries under 32 KiB have none: they live inside cache.db)."""
    (path,) = folder.rglob(f"{key}.val")
    return path


def _garbage(folder):
    (folder / "cache.db").write_bytes(os.urandom(8192))


def _hits(folder) -> list[int]:
    with TieredStore(folder, StoreBudgets(host_bytes=0), options=OPTIONS) as opened:
        return [seed for seed in SMALL + LARGE if opened.get(_key(seed), _tokens(seed)) is not None]


def test_stats_counts_entries_and_a_catalog_that_is_not_utf8(store):
    result = run("cache", "stats", "--store", str(store))
    assert result.exit_code == 0, result.output
    assert "entries on disk: 5" in result.output and "registered chunks: 2" in result.output


def test_clean_store_verifies_with_exit_0(store):
    result = run("cache", "verify", "--store", str(store))
    assert result.exit_code == 0 and "checked 5 entries" in result.output and "0 corrupt" in result.output


def test_stats_and_verify_report_a_damaged_index_without_changing_it(store):
    _garbage(store)
    damaged = (store / "cache.db").read_bytes()
    stats = run("cache", "stats", "--store", str(store))
    assert stats.exit_code == 1 and "index damaged" in stats.output and "Traceback" not in stats.output
    assert f"entry files: {len(LARGE)}" in stats.output and "registered chunks: 2" in stats.output
    verify = run("cache", "verify", "--store", str(store))
    assert verify.exit_code == 1 and "cache verify --repair" in verify.output and "nothing was changed" in verify.output
    assert (store / "cache.db").read_bytes() == damaged


@pytest.mark.parametrize("damage", ["garbage", "missing"])
def test_verify_repair_rebuilds_the_index_from_entry_files(store, damage):
    if damage == "garbage":
        _garbage(store)
    else:
        (store / "cache.db").unlink()
    damaged = (store / "cache.db").read_bytes() if damage == "garbage" else None
    result = run("cache", "verify", "--repair", "--store", str(store))
    assert result.exit_code == 0, result.output  # problems were found and every one repaired
    assert "problems repaired" in result.output
    assert f"{len(LARGE)} entries recovered" in result.output and "lost:" in result.output
    if damage == "garbage":
        (kept,) = store.glob("cache.db.damaged-*")
        assert kept.read_bytes() == damaged and kept.name in result.output
    assert _hits(store) == LARGE  # small entries lived inside the lost index
    again = run("cache", "verify", "--store", str(store))
    assert again.exit_code == 0 and "checked 3 entries" in again.output


def test_clear_on_a_damaged_index_starts_empty_and_keeps_it(store):
    _garbage(store)
    result = run("cache", "clear", "--yes", "--store", str(store))
    assert result.exit_code == 0, result.output
    assert f"removed {len(LARGE)} entry files" in result.output and "cache.db.damaged-" in result.output
    assert len(list(store.glob("cache.db.damaged-*"))) == 1 and not (store / "catalog.jsonl").exists()
    assert list(entry_files(store)) == [] and _hits(store) == []
    assert run("cache", "verify", "--store", str(store)).exit_code == 0


def test_verify_reports_rows_without_files_and_files_without_rows(store):
    _file_of(store, _key(3)).unlink()
    orphan = store / "ab" / f"{'ab' * 32}.val"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"written by a process killed before its row was committed")
    os.utime(orphan, (time.time() - 3600,) * 2)
    found = run("cache", "verify", "--store", str(store))
    assert found.exit_code == 1, found.output
    assert "1 with a missing file" in found.output and "1 orphan files" in found.output
    assert _key(3) in found.output and "not repaired" in found.output and orphan.exists()
    repaired = run("cache", "verify", "--repair", "--store", str(store))
    assert repaired.exit_code == 0 and "problems repaired" in repaired.output and not orphan.exists()
    clean = run("cache", "verify", "--store", str(store))
    assert clean.exit_code == 0 and "checked 4 entries" in clean.output


def test_verify_removes_corrupt_entries_and_says_so(store):
    victim = _file_of(store, _key(4))
    victim.write_bytes(victim.read_bytes()[:500])
    result = run("cache", "verify", "--store", str(store))
    assert result.exit_code == 1 and f"removed corrupt entry {_key(4)}" in result.output
    assert "corrupt entries removed" in result.output
    assert run("cache", "verify", "--store", str(store)).exit_code == 0


@pytest.mark.parametrize("name", ["cache.db-journal", "cache.db-wal"])
def test_verify_repair_moves_a_planted_index_link_aside_and_never_follows_it(store, tmp_path, name):
    outside = tmp_path / "profile"
    outside.write_bytes(b"export PATH=/usr/bin\n")
    (store / name).symlink_to(outside)
    found = run("cache", "verify", "--store", str(store))
    assert found.exit_code == 1 and f"{name}: it is a symbolic link" in found.output and "Traceback" not in found.output
    repaired = run("cache", "verify", "--repair", "--store", str(store))
    assert repaired.exit_code == 0, repaired.output
    (aside,) = store.glob(f"cache.db.damaged-*{name.removeprefix('cache.db')}")
    assert aside.is_symlink() and outside.read_bytes() == b"export PATH=/usr/bin\n"
    assert not os.path.lexists(store / name) and _hits(store) == LARGE
    assert run("cache", "verify", "--store", str(store)).exit_code == 0


def test_stats_names_other_tenants_catalogs_and_clear_removes_them(tmp_path):
    from fusionrag_llm import FusionRAG

    folder = tmp_path / "tenants"
    rag = FusionRAG.from_pretrained("tiny", store=folder)
    rag.add_chunks(["Acme's own passage about the harbour."], embeddings=[[1, 0]], fuse=False, tenant="acme")
    rag.add_chunks(["A passage of the default tenant."], embeddings=[[0, 1]], fuse=False)
    reopened = FusionRAG(rag.engine.loaded, store=folder)  # the catalogs travel with the folder
    assert len(reopened.chunks_of("acme")) == 1 and len(reopened.chunks) == 1
    stats = run("cache", "stats", "--store", str(folder))
    assert "registered chunks: 1" in stats.output and "1 other tenants" in stats.output
    assert run("cache", "clear", "--yes", "--store", str(folder)).exit_code == 0
    assert not list(folder.glob("catalog*.jsonl"))
