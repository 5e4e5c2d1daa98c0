"""``fusionrag ingest`` then ``fusionrag query`` end to end, ``fusionrag cache``, and bad input."""

import pytest
from click.testing import CliRunner

from fusionrag_llm.cli.main import cli
from fusionrag_llm.ingest.doc_index import DOCUMENTS_LOG, DocumentIndex
from fusionrag_llm.storage import FileRecordLog

DOCS = {
    "river.md": "# Rivers\n\nThe Zorblat river flows through the city of Quennel.\n\nIts water is cold all year.",
    "kingdom.txt": "Quennel is the capital of Marovia, a small kingdom in the hills.",
    "notes/trade.md": "Marovia exports cheese, wool and carved wooden spoons to its neighbours.",
}


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture()
def corpus(tmp_path):
    for name, text in DOCS.items():
        path = tmp_path / "docs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "docs"


def test_ingest_then_query_then_resume(corpus, tmp_path):
    store = str(tmp_path / "store")
    # the compute dtype: path blocks are exact, so chunk 1 is served exactly
    exact = ("--engine-option", "kv_codec=float32")
    first = run("ingest", str(corpus), "--model", "tiny", "--store", store, "--neighbors", "2", *exact)
    assert first.exit_code == 0, first.output
    assert "3 files, 3 chunks (3 new): 3 plain and 3 fused entries computed" in first.output
    again = run("ingest", str(corpus), "--model", "tiny", "--store", store, "--neighbors", "2", *exact)
    assert "(0 new): 0 plain and 0 fused entries computed" in again.output
    answer = run("query", "Which river flows through Quennel?", "--model", "tiny", "--store", store,
                 "--top-k", "2", "--max-new-tokens", "3", "--show-chunks", *exact)  # fmt: skip
    assert answer.exit_code == 0, answer.output
    assert "river.md" in answer.output.splitlines()[0]  # the best hit is the river document
    assert "exact 1, chunk 1, miss 0" in answer.output and "recomputed" in answer.output  # chunk 1 follows S0
    stats = run("cache", "stats", "--store", store)
    assert "registered chunks: 3" in stats.output
    verify = run("cache", "verify", "--store", store)
    assert verify.exit_code == 0 and "0 corrupt" in verify.output


def test_bad_inputs_fail_cleanly_and_lose_nothing(corpus, tmp_path):
    store = str(tmp_path / "store")
    assert run("ingest", str(corpus), "--model", "tiny", "--store", store).exit_code == 0
    (tmp_path / "blob.txt").write_bytes(b"\x89PNG\x00\x00binary")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.md").write_text("  \n")
    cases = [
        ([str(tmp_path / "missing")], "does not exist"),
        ([str(tmp_path / "blob.txt")], "looks like a binary file"),
        ([str(tmp_path / "latin1.txt")], "is not UTF-8 text"),
        ([str(corpus), str(tmp_path / "empty.md")], "is empty"),
        ([str(tmp_path / "store")], "no text files"),
    ]
    for paths, message in cases:
        result = run("ingest", *paths, "--model", "tiny", "--store", store)
        assert result.exit_code != 0 and message in result.output, (paths, result.output)
        assert "Traceback" not in result.output
    other = run("query", "What does Marovia export?", "--model", "tiny-qwen2", "--store", store)
    assert other.exit_code != 0 and "was built with model 'tiny'" in other.output
    assert len(DocumentIndex(FileRecordLog(tmp_path / "store", DOCUMENTS_LOG))) == 3  # nothing already ingested was lost
    assert run("query", "What does Marovia export?", "--model", "tiny", "--store", store, "--max-new-tokens", "2").exit_code == 0
    bad_ratio = run("query", "What does Marovia export?", "--model", "tiny", "--store", store, "--ratio", "2")
    assert bad_ratio.exit_code != 0 and "--ratio" in bad_ratio.output
    bad_method = run("query", "What does Marovia export?", "--model", "tiny", "--store", store, "--method", "lego")
    assert bad_method.exit_code != 0 and "'full_attention', 'full_reuse'" in bad_method.output


def test_query_on_an_empty_store_and_cache_clear(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    result = run("query", "anything?", "--model", "tiny", "--store", str(store))
    assert result.exit_code != 0 and "run 'fusionrag ingest PATH' first" in result.output
    cleared = run("cache", "clear", "--store", str(store), "--yes")
    assert cleared.exit_code == 0 and "removed" in cleared.output


def test_inputs_are_checked_before_the_model_loads(corpus, tmp_path):
    """A missing path to ingest and a store with nothing ingested are reported as such, not as the
    model that failed to load first (no model is found under the name given)."""
    store = tmp_path / "store"
    store.mkdir()
    absent_model = str(tmp_path / "no-such-model")
    missing = run("ingest", str(tmp_path / "missing"), "--model", absent_model, "--store", str(store))
    assert missing.exit_code != 0 and "does not exist" in missing.output
    empty = run("query", "anything?", "--model", absent_model, "--store", str(store))
    assert empty.exit_code != 0 and "run 'fusionrag ingest PATH' first" in empty.output
    loads = run("ingest", str(corpus), "--model", absent_model, "--store", str(store))  # good input: the model is next
    assert loads.exit_code != 0 and "does not exist" not in loads.output


def test_a_query_without_a_store_creates_no_folder(tmp_path):
    missing = tmp_path / "nowhere" / "store"
    result = run("query", "anything?", "--model", "tiny", "--store", str(missing))
    assert result.exit_code != 0 and "no KV store" in result.output and not missing.parent.exists()


def test_cache_clear_says_it_keeps_the_retrieval_index_and_all_removes_it(corpus, tmp_path):
    store = str(tmp_path / "store")
    assert run("ingest", str(corpus), "--model", "tiny", "--store", store).exit_code == 0
    documents = tmp_path / "store" / DOCUMENTS_LOG
    assert "retrieval index: 3 chunks" in run("cache", "stats", "--store", store).output
    kept = run("cache", "clear", "--store", store, "--yes")
    assert kept.exit_code == 0 and "kept the retrieval index" in kept.output and documents.is_file()
    assert run("query", "What does Marovia export?", "--model", "tiny", "--store", store, "--max-new-tokens", "2").exit_code == 0
    gone = run("cache", "clear", "--store", store, "--all", "--yes")
    assert gone.exit_code == 0 and "removed the retrieval index" in gone.output and not documents.exists()
    assert "retrieval index: 0 chunks" in run("cache", "stats", "--store", store).output


def test_every_option_of_every_command_has_help():
    import click

    from fusionrag_llm.cli.main import cli

    def commands(group, prefix=""):
        for name, command in group.commands.items():
            yield f"{prefix}{name}", command
            if isinstance(command, click.Group):
                yield from commands(command, f"{prefix}{name} ")

    missing = [f"{name} {param.name}" for name, command in commands(cli) for param in command.params
               if isinstance(param, click.Option) and not param.help]  # fmt: skip
    assert not missing, missing


def test_a_bf16_store_is_read_with_its_recorded_codec_and_each_codec_has_its_own_keys(corpus, tmp_path):
    store = str(tmp_path / "store")
    bf16 = ("--engine-option", "kv_codec=bf16")
    assert run("ingest", str(corpus), "--model", "tiny", "--store", store, "--no-fuse", *bf16).exit_code == 0
    question = ("query", "Which river flows through Quennel?", "--model", "tiny", "--store", store, "--top-k", "2",
                "--max-new-tokens", "2", "--method", "full_reuse")  # fmt: skip
    for same in (run(*question, *bf16), run(*question)):  # told, or the store's record
        assert same.exit_code == 0, same.output
        assert "exact 0, chunk 2, miss 0" in same.output  # bf16 entries: served as chunks, never as exact blocks
    for other in ("model", "int8"):  # the compute dtype and int8 have keys of their own
        refused = run(*question, "--engine-option", f"kv_codec={other}")
        assert refused.exit_code != 0 and "--engine-option kv_codec=" in refused.output
    bad = run(*question, "--engine-option", "kv_codec=int3")
    assert bad.exit_code != 0 and "int4" in bad.output


def test_query_with_cache_craft_variants_stores_one_then_reads_it(corpus, tmp_path):
    store = str(tmp_path / "store")
    assert run("ingest", str(corpus), "--model", "tiny", "--store", store, "--neighbors", "2", "--variant-notes").exit_code == 0
    ask = ("query", "Which river flows through Quennel?", "--model", "tiny", "--store", store, "--top-k", "2",
           "--max-new-tokens", "2", "--method", "cache_craft", "--engine-option", "craft_variants=5")  # fmt: skip
    first = run(*ask)
    assert first.exit_code == 0, first.output
    assert "variants_made 1" in first.output  # the second chunk came after a prefix no variant had
    again = run(*ask)
    assert "request 1" in again.output and "variants_made" not in again.output  # nothing new to store
    bad = run(*ask[:-1], "craft_variants=-1")
    assert bad.exit_code != 0 and "-1" in bad.output


def test_query_loads_layer_by_layer_when_asked_with_the_same_answer(corpus, tmp_path):
    store = str(tmp_path / "store")
    assert run("ingest", str(corpus), "--model", "tiny", "--store", store, "--neighbors", "2").exit_code == 0
    ask = ("query", "Which river flows through Quennel?", "--model", "tiny", "--store", store, "--top-k", "3",
           "--max-new-tokens", "4")  # fmt: skip
    answers = [run(*ask, "--engine-option", f"layerwise_load={flag}") for flag in ("false", "true")]
    assert all(a.exit_code == 0 for a in answers), [a.output for a in answers]
    untimed = [[line for line in a.output.splitlines() if "TTFT" not in line and "decode" not in line] for a in answers]
    assert untimed[0] == untimed[1] and any("reused" in line for line in untimed[0])  # same answer and token counts


def test_each_tenant_ingests_and_retrieves_only_its_own_documents(corpus, tmp_path):
    store = str(tmp_path / "store")
    other = tmp_path / "other"
    other.mkdir()
    (other / "moon.txt").write_text("The moon of Vetra is called Ulm and it glows green at dusk.")
    tiny = ("--model", "tiny", "--store", store)
    assert run("ingest", str(corpus), *tiny, "--neighbors", "2", "--tenant", "acme").exit_code == 0
    assert "1 files, 1 chunks (1 new)" in run("ingest", str(other), *tiny, "--no-fuse").output
    ask = ("query", "Which river flows through Quennel?", *tiny, "--top-k", "3", "--max-new-tokens", "2", "--show-chunks")
    acme = run(*ask, "--tenant", "acme")
    assert acme.exit_code == 0 and "moon.txt" not in acme.output and "river.md" in acme.output, acme.output
    assert "miss 0" in acme.output  # its own chunks, stored for it
    default = run(*ask)
    assert default.exit_code == 0 and "moon.txt" in default.output and "river.md" not in default.output, default.output
    nobody = run(*ask, "--tenant", "nobody")
    assert nobody.exit_code == 1 and "tenant 'nobody''s document index" in nobody.output and "--tenant nobody" in nobody.output
    bad = run(*ask, "--tenant", "x" * 300)
    assert bad.exit_code == 2 and "tenant" in bad.output
    cleared = run("cache", "clear", "--store", store, "--all", "--yes")
    assert cleared.exit_code == 0 and "documents.t-" in cleared.output
    assert not list((tmp_path / "store").glob("documents*.jsonl"))
