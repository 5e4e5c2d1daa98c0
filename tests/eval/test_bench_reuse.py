"""`fusionrag bench reuse` on the tiny model: the turn cache computes less, de-duplication shortens
prompts, and bad settings are clear errors."""

import json

from click.testing import CliRunner

from fusionrag_llm.cli.main import cli
from fusionrag_llm.eval.bench_reuse import ReuseConfig


def test_bench_reuse_reports_every_turn_of_every_run(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "reuse", "--model", "tiny", "--dataset", "synthetic", "--turns", "3",
                                      "--window", "2", "--requests", "4", "--pool", "4", "--per-request", "2",
                                      "--max-new-tokens", "4", "--out", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "reuse.json").read_text())
    runs = report["turns"]
    assert list(runs) == ["no reuse", "turn reuse", "turn reuse + dedupe"]
    none, turns, dedupe = (runs[name] for name in runs)
    assert all(row["turn_tokens"] == 0 for row in none) and all(row["turn_tokens"] > 0 for row in turns[1:])
    assert sum(r["computed_tokens"] for r in turns) < sum(r["computed_tokens"] for r in none)
    assert dedupe[-1]["prompt_tokens"] < turns[-1]["prompt_tokens"]  # the repeated passage became a hint
    reorder = report["reorder"]
    assert set(reorder) == {"as retrieved", "reordered"}
    assert all(0 <= r["prefix_hit_rate"] <= 1 and len(r["ttft_s"]) == 4 for r in reorder.values())
    assert (tmp_path / "reuse.md").exists() and (tmp_path / "reuse.png").exists()


def test_reuse_settings_are_checked():
    import pytest

    with pytest.raises(ValueError, match="per_request .* cannot exceed pool"):
        ReuseConfig("synthetic", "tiny", pool=3, per_request=4)
    with pytest.raises(ValueError, match="turns must be an int >= 1"):
        ReuseConfig("synthetic", "tiny", turns=0)
