"""``fusionrag bench store`` end to end on the tiny model."""

import json

from click.testing import CliRunner

from fusionrag_llm.cli.main import cli


def test_bench_store_writes_tier_ttft_and_overlap_numbers(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "store", "--dataset", "synthetic", "--passages", "2", "--requests", "2",
                                      "--model", "tiny", "--neighbors", "1", "--out", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "store.json").read_text())
    load, ttft, overlap = data["tier_load"], data["ttft"], data["overlap"]
    assert load["disk_s"] > 0 and load["compute_s"] > 0 and load["context_tokens"] > 0
    assert ttft["fusionrag_disk"]["tier_hits"]["disk"] >= 1 and ttft["fusionrag_memory"]["tier_hits"]["disk"] == 0
    assert overlap["requests"] == 2 and overlap["same_answers"] and overlap["prefetch_s"] > 0 and overlap["wait_s"] >= 0
    assert "hidden behind compute" in (tmp_path / "store.md").read_text()
