"""``fusionrag bench ingest --workers N`` on the tiny model and the session's real local Ray cluster."""

import json

from click.testing import CliRunner

from fusionrag_llm.cli.main import cli


def test_ingest_with_workers(ray_cluster, tmp_path):
    args = ["bench", "ingest", "--dataset", "synthetic", "--chunks", "6", "--neighbors", "2", "--model", "tiny",
            "--no-progress", "--workers", "2", "--out", str(tmp_path / "out")]  # fmt: skip
    refused = CliRunner().invoke(cli, args)  # the store in memory cannot be shared with the workers
    assert refused.exit_code != 0 and "needs a store folder" in refused.output
    done = CliRunner().invoke(cli, [*args, "--store", str(tmp_path / "store")])
    assert done.exit_code == 0, done.output + repr(done.exception)
    result = json.loads((tmp_path / "out" / "ingest.json").read_text())["result"]
    assert result["workers"] == 2 and result["plain"]["computed"] == result["fused"]["computed"] == 6
    assert result["again"]["plain_computed"] == result["again"]["fused_computed"] == 0
    assert result["fused"]["missing"] == 0 and result["bytes_per_token"] == {"plain": 768.0, "fused": 768.0}
    parts = result["startup_s"] + result["plain"]["seconds"] + result["fused"]["seconds"] + result["stop_s"]
    assert abs(parts - result["total_s"]) < 1e-6 and result["chunks_per_s"] == 6 / result["total_s"]
    assert "| all, 2 Ray worker(s), end to end | 6 |" in (tmp_path / "out" / "ingest.md").read_text()
