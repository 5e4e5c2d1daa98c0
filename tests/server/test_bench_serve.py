"""`fusionrag bench serve` on the tiny model: every level answers every request, the same answers."""

import json

from click.testing import CliRunner

from fusionrag_llm.cli.main import cli
from fusionrag_llm.eval.bench_serve import _percentile


def test_bench_serve_writes_its_table_and_every_level_gives_the_one_by_one_answers(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "serve", "--model", "tiny", "--dataset", "synthetic", "--questions", "5",
                                      "--lengths", "200", "--max-new-tokens", "6", "--concurrency", "1,4",
                                      "--out", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "serve.json").read_text())
    levels = report["levels"]
    assert [level["concurrency"] for level in levels] == [1, 4]
    assert all(level["same_answers"] == 5 and level["completion_tokens"] > 0 for level in levels)
    assert all(len(level["ttft_s"]) == 5 and level["ttft_p50_s"] <= level["ttft_p95_s"] for level in levels)
    assert (tmp_path / "serve.md").read_text().count("\n| ") == 4  # header, rule, two levels
    assert (tmp_path / "serve.png").exists()


def test_bad_concurrency_is_a_clear_error():
    result = CliRunner().invoke(cli, ["bench", "serve", "--model", "tiny", "--concurrency", "1,x"])
    assert result.exit_code != 0 and "comma-separated ints" in result.output


def test_nearest_rank_percentile_by_hand():
    ordered = [float(i) for i in range(1, 21)]  # 1..20
    assert _percentile(ordered, 0.95) == 19.0 and _percentile(ordered, 0.5) == 10.0 and _percentile([3.0], 0.95) == 3.0
