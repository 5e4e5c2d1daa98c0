"""The resolve-cost benchmark on tiny sizes: rows per size, a table, JSON written."""

import doctest
import json

import pytest

from fusionrag_llm.eval import bench_resolve
from fusionrag_llm.eval.bench_resolve import ResolveBenchConfig, run_resolve_bench


def test_resolve_bench_reports_plan_and_assembly_cost_per_token(tmp_path):
    config = ResolveBenchConfig(sizes=(256, 512), chunk_tokens=64, method="full_reuse", repeats=1, threads=1,
                                out=tmp_path)  # fmt: skip
    result = run_resolve_bench(config)
    rows = result["rows"]
    assert [r["chunks"] for r in rows] == [4, 8] and all(r["within_window"] for r in rows)
    assert all(r["prompt_tokens"] > 64 * r["chunks"] for r in rows)  # chunks plus prefix, separators and suffix
    assert all(r["plan_s"] > 0 and r["plan_assemble_s"] > 0 for r in rows)  # one timed sample each: no order between them
    assert all(r["plan_us_per_token"] > 0 and r["plan_assemble_us_per_token"] > 0 for r in rows)
    written = json.loads((tmp_path / "resolve.json").read_text())
    assert written["rows"] == rows and written["config"]["out"] == str(tmp_path)
    assert "plan us/token" in (tmp_path / "resolve.md").read_text() == result["table"] + "\n"


@pytest.mark.parametrize("bad", [dict(sizes=()), dict(sizes=(0,)), dict(chunk_tokens=2), dict(repeats=0),
                                 dict(method="full_attention"), dict(threads=0)])  # fmt: skip
def test_bad_settings_say_what_is_allowed(bad):
    with pytest.raises(ValueError, match=next(iter(bad)).rstrip("s")):
        ResolveBenchConfig(**bad)


def test_doctest():
    assert doctest.testmod(bench_resolve).failed == 0
