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


def test_bench_store_with_a_remote_times_one_entry_from_each_tier(tmp_path, redis_server):
    result = CliRunner().invoke(cli, ["bench", "store", "--dataset", "synthetic", "--passages", "2", "--requests", "1",
                                      "--model", "tiny", "--neighbors", "1", "--out", str(tmp_path),
                                      "--remote", redis_server.url])  # fmt: skip
    assert result.exit_code == 0, result.output
    load = json.loads((tmp_path / "store.json").read_text())["per_entry_load"]
    per = load["seconds_per_entry"]
    assert load["entries"] == 2 and load["mean_entry_bytes"] > 0 and all(per[t] > 0 for t in ("host", "disk", "remote"))
    assert redis_server.client().hlen("fusionrag:kv:size") == 2  # the entries were copied to the server to be read back
    assert "remote tier (Redis over loopback)" in (tmp_path / "store.md").read_text()
