"""``fusionrag ingest --workers N``: files ingested by Ray workers (the session's real local cluster)."""

import pytest
from click.testing import CliRunner

from fusionrag_llm.cli.main import cli

pytestmark = pytest.mark.slow  # other processes (see pyproject.toml)

DOCS = {
    "canal.md": "# Canals\n\nThe Ostrel canal links the port of Vaney to the lake of Sorn.",
    "lake.txt": "The lake of Sorn freezes every winter; skaters cross it to reach Vaney.",
    "notes/boats.md": "Flat barges carry salt and timber along the Ostrel canal in summer.",
}


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_ingest_with_workers_then_in_one_process_computes_nothing_more(ray_cluster, tmp_path):
    for name, text in DOCS.items():
        (tmp_path / "docs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "docs" / name).write_text(text)
    store = str(tmp_path / "store")
    first = run("ingest", str(tmp_path / "docs"), "--model", "tiny", "--store", store, "--neighbors", "2", "--workers", "2")
    assert first.exit_code == 0, first.output
    assert "3 files, 3 chunks (3 new): 3 plain and 3 fused entries computed" in first.output
    again = run("ingest", str(tmp_path / "docs"), "--model", "tiny", "--store", store, "--neighbors", "2")
    assert "3 chunks (0 new): 0 plain and 0 fused entries computed" in again.output
    answer = run("query", "Where does the canal lead?", "--model", "tiny", "--store", store, "--top-k", "2",
                 "--max-new-tokens", "2", "--show-chunks")  # fmt: skip
    assert answer.exit_code == 0 and "canal.md" in answer.output.splitlines()[0], answer.output


def test_a_bad_worker_count_is_refused_with_the_allowed_range(tmp_path):
    (tmp_path / "a.txt").write_text("Some text to ingest.")
    bad = run("ingest", str(tmp_path / "a.txt"), "--model", "tiny", "--store", str(tmp_path / "s"), "--workers", "0")
    assert bad.exit_code != 0 and "0 is not in the range 1<=x<=1024" in bad.output
