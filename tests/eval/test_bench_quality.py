"""``fusionrag bench quality`` end to end on the tiny model: files, numbers, resuming."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fusionrag_llm import FusionRAG
from fusionrag_llm.cli.main import cli
from fusionrag_llm.eval.datasets import default_musique_path
from fusionrag_llm.eval.metrics import parting_position

METHODS = "full_attention,full_reuse,cacheblend,fusionrag,fusionrag_paper"
SYNTHETIC = ["bench", "quality", "--dataset", "synthetic", "--questions", "2", "--passages", "3", "--method", METHODS,
             "--ratio", "0,0.15", "--model", "tiny", "--neighbors", "2", "--max-new-tokens", "4"]  # fmt: skip


@pytest.fixture
def count_generate(monkeypatch):
    """Methods of every answer the benchmark asks for (generate and stream both prefill)."""
    calls = []
    for name in ("generate", "stream"):
        original = getattr(FusionRAG, name)

        def counting(self, *args, _original=original, **kwargs):
            calls.append(args[1] if len(args) > 1 else kwargs.get("method"))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(FusionRAG, name, counting)
    return calls


def _invoke(args):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("quality")
    result = _invoke([*SYNTHETIC, "--out", str(out)])
    return out, result.output


def _rows(data):
    return {(row["method"], row["ratio"]): row for row in data["aggregates"]}


def test_writes_json_table_and_plots(synthetic_run):
    out, output = synthetic_run
    for name in ("quality.json", "quality.md", "quality_kl.png", "quality_f1.png", "quality_kl_per_question.png",
                 "quality.partial.jsonl"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    assert (out / "quality_kl.png").read_bytes()[:4] == b"\x89PNG"
    table = (out / "quality.md").read_text()
    assert "| fusionrag_paper | 0.15 | 2 |" in table and "| full_reuse | - | 2 |" in table
    assert table in output
    # every fusionrag request was served its chunks' fused entries (3 passages: 3 of 2 questions; the
    # chunk right after the canonical prefix is read exactly and counts for neither)
    served = table.split("## Entries served")[1]
    assert "| fusionrag | 0.15 | 2 | 4 | 0 | 0 |" in served and "| full_reuse | - | 2 | 0 | 4 | 0 |" in served


def test_a_run_without_store_keeps_its_entries_in_a_temporary_folder_it_removes():
    import gc

    from fusionrag_llm.eval.bench_data import open_bench_rag

    rag = open_bench_rag("tiny")
    folder = rag.store.directory
    rag.add_chunks(["A passage the run stores.", "Another passage."], neighbors=1, progress=False)
    assert folder.is_dir() and any(folder.iterdir())
    del rag
    gc.collect()
    assert not folder.exists()


def test_json_content(synthetic_run):
    data = json.loads((synthetic_run[0] / "quality.json").read_text())
    assert set(data) == {"config", "machine", "run", "aggregates", "distribution", "greedy_agreement", "partings",
                         "per_question", "records"}  # fmt: skip
    assert data["config"]["methods"][:2] == ["full_attention", "full_reuse"] and data["config"]["ratios"] == [0.0, 0.15]
    assert {"platform", "cpu_count", "torch"} <= set(data["machine"])
    assert data["run"]["computed"] == len(data["records"]) == 2 * (2 + 3 * 2)
    assert data["run"]["offline"]["evicted"] == 0  # the run's store kept every entry it needs
    for record in data["records"]:
        assert 0 <= record["f1"] <= 1 and record["em"] in (0.0, 1.0) and record["kl"] >= 0
        assert record["ttft_s"] > 0 and record["prompt_tokens"] > 0
        # the path cache is off, so no method reuses another's exact KV; only the chunk right after
        # the canonical prefix is exact, served from its own plain entry
        assert record["path_hits"]["exact"] == (0 if record["method"] == "full_attention" else 1)
    assert len(data["per_question"]) == 2 and len(data["distribution"]) == len(data["aggregates"])
    assert all(len(question["methods"]) == 8 for question in data["per_question"])
    spread = {(row["method"], row["ratio"]): row for row in data["distribution"]}
    assert spread[("full_reuse", None)]["worse_than_full_reuse"] == 0 and spread[("full_attention", None)]["kl_max"] == 0
    rows = _rows(data)
    for row in data["greedy_agreement"]:  # its whole-answer share is the table's greedy EM
        assert row["whole"] == rows[(row["method"], row["ratio"])]["greedy_em"]
        assert list(row["shares"].values()) == sorted(row["shares"].values(), reverse=True) and row["shares"]["1"] >= row["whole"]
    answers = {(r["qid"], r["method"], r["ratio"]): r for r in data["records"]}
    for record in data["records"]:
        fa_record = answers[(record["qid"], "full_attention", None)]
        assert len(fa_record["margins"]) == len(fa_record["token_ids"]) and all(0 <= m <= 1 for m in fa_record["margins"])
        if record["method"] != "full_attention":  # a gap exactly where the greedy answer parts from FA's
            at = parting_position(fa_record["token_ids"], record["token_ids"])
            both = at is not None and at < min(len(record["token_ids"]), len(fa_record["token_ids"]))
            assert (record["parting_gap"] is not None) == both
            assert record["parting_gap"] is None or -1e-4 <= record["parting_gap"] <= 1  # its own greedy choice
    parted = {(row["method"], row["ratio"]): row["parted"] for row in data["partings"]["rows"]}
    assert all(parted[key] == round(row["questions"] * (1 - row["greedy_em"])) for key, row in rows.items()
               if key[0] != "full_attention")  # fmt: skip
    fa, fr = rows[("full_attention", None)], rows[("full_reuse", None)]
    assert fa["kl"] == 0 and fa["first_token"] == 1 and fa["greedy_em"] == 1
    assert fa["norm_kl"] == 1 and fr["norm_kl"] == 0 and fr["kl"] > 0
    for method in ("cacheblend", "fusionrag", "fusionrag_paper"):
        for ratio in (0.0, 0.15):
            row = rows[(method, ratio)]
            assert row["questions"] == 2 and isinstance(row["norm_kl"], float)
            assert isinstance(row["norm_f1"], float) and isinstance(row["norm_first_token"], float)
            assert (row["recomputed_tokens"] > 0) == (ratio > 0)


def test_second_run_resumes_without_generating(synthetic_run, count_generate):
    out, _ = synthetic_run
    before = json.loads((out / "quality.json").read_text())["records"]
    result = _invoke([*SYNTHETIC, "--out", str(out)])
    assert count_generate == [] and "0 computed, 16 resumed" in result.output
    assert json.loads((out / "quality.json").read_text())["records"] == before


def test_interrupted_run_computes_only_what_is_missing(tmp_path, synthetic_run, count_generate):
    lines = (synthetic_run[0] / "quality.partial.jsonl").read_text().splitlines()
    (tmp_path / "quality.partial.jsonl").write_text("\n".join(lines[:-3]) + "\n" + lines[-3][:40])  # torn last line
    result = _invoke([*SYNTHETIC, "--out", str(tmp_path)])
    assert "3 computed, 13 resumed" in result.output
    # three records, the untimed warm-up, and the reference answer whose prefill scores the reference
    assert len(count_generate) == 3 + 1 + 1 and count_generate.count("full_attention") == 2
    kept = {json.dumps(json.loads(line)) for line in lines[1:-3]}
    now = {json.dumps(r) for r in json.loads((tmp_path / "quality.json").read_text())["records"]}
    assert kept <= now  # resumed records are reused as they were, timings included


def test_other_config_in_the_same_folder_is_a_clean_error(synthetic_run):
    out, _ = synthetic_run
    args = [a if a != "3" else "2" for a in SYNTHETIC]  # --passages 2
    result = CliRunner().invoke(cli, [*args, "--out", str(out)])
    assert result.exit_code != 0 and "differs in: passages" in result.output and "delete it to start over" in result.output


def test_bad_options_are_rejected():
    for bad in (["--method", "fusionrag:overlap"], ["--ratio", "0.1,2"], ["--dataset", "/nonexistent.json"]):
        result = CliRunner().invoke(cli, [*SYNTHETIC, *bad])
        assert result.exit_code == 2 and "Traceback" not in result.output, bad


@pytest.mark.skipif(default_musique_path() is None, reason="../shared/data/musique_dev.json is not present")
def test_musique_file(tmp_path):
    # Byte-level tokens: one MuSiQue passage is ~2.5k tiny tokens, so one passage per question fits
    # the tiny model's 4096-token window (two do not).
    path = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "musique_dev.json"
    _invoke(["bench", "quality", "--dataset", str(path), "--questions", "2", "--passages", "1", "--method", "fusionrag",
             "--ratio", "0.15", "--model", "tiny", "--max-new-tokens", "2", "--out", str(tmp_path)])  # fmt: skip
    data = json.loads((tmp_path / "quality.json").read_text())
    assert data["config"]["dataset"].endswith("musique_dev.json")
    assert {r["qid"] for r in data["records"]} == {"musique-0", "musique-1"}
    assert _rows(data)[("fusionrag", 0.15)]["questions"] == 2


def test_a_kv_codec_run_is_another_run(tmp_path):
    args = [*SYNTHETIC[: SYNTHETIC.index("--method")], "--method", "full_attention,full_reuse", "--ratio", "0",
            *SYNTHETIC[SYNTHETIC.index("--model") :]]  # fmt: skip
    _invoke([*args, "--out", str(tmp_path)])
    first_line = (tmp_path / "quality.partial.jsonl").read_text().splitlines()[0]
    assert "kv_codec" not in json.loads(first_line)["config"]  # logs of the lossless default stay resumable
    assert json.loads((tmp_path / "quality.json").read_text())["config"]["kv_codec"] == "model"
    refused = CliRunner().invoke(cli, [*args, "--engine-option", "kv_codec=int4", "--out", str(tmp_path)])
    assert refused.exit_code != 0 and "differs in: kv_codec" in refused.output
