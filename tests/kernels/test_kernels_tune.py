"""The launch-configuration sweep: its CPU smoke run, the selection of the fastest correct row."""

import json

from kernel_cases import needs_triton

from fusionrag_llm.kernels import tune


def test_best_skips_failed_and_untimed_rows():
    rows = [{"case": "a", "variant": "v", "ok": True, "ms": 2.0, "config": [64, 64, 4, 2]},
            {"case": "a", "variant": "v", "ok": False, "ms": 0.5, "config": [128, 64, 8, 2]},
            {"case": "a", "variant": "v", "ok": False, "error": "skipped: time budget", "config": [16, 64, 4, 2]},
            {"case": "a", "variant": "w", "ok": True, "ms": 1.0, "config": [64, 64, 4, 2]},
            {"case": "a", "variant": "v", "ok": True, "ms": 1.5, "config": [64, 128, 4, 3]}]  # fmt: skip
    assert tune.best(rows, "a", "v")["config"] == [64, 128, 4, 3]
    assert tune.best(rows, "b", "v") is None


def test_dry_run_lists_every_case(capsys):
    assert tune.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(f"prefill f={f:g}" in out for f in (0.05, 0.15, 0.3, 1.0))
    assert "16 queries" in out and "decode" in out


@needs_triton
def test_tune_small_smoke(tmp_path):
    out = tmp_path / "tune.json"
    assert tune.main(["--small", "--context", "40", "--fractions", "0.3", "--json", str(out), "--seed", "3"]) == 0
    result = json.loads(out.read_text())
    cases = {r["case"] for r in result["rows"]}
    assert cases == {"prefill f=0.3", "16 queries", "decode"}
    assert all(r["ok"] and r["rel_err"] < 1e-5 and r["ms"] > 0 for r in result["rows"])
    # the default and each grid entry unlike it, once per case
    for case in cases:
        configs = [tuple(r["config"]) for r in result["rows"] if r["case"] == case]
        assert len(configs) == len(set(configs)) and sum(r["default"] for r in result["rows"] if r["case"] == case) == 1
    assert "speedup" in tune.format_summary(result)
    assert tune.main(["--small", "--context", "40", "--fractions", "0.3", "--json", str(out), "--defaults-only"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 3 and all(r["default"] and r["ok"] for r in rows)


def test_tune_refuses_cpu_without_small(capsys):
    import torch

    if torch.cuda.is_available():
        return
    assert tune.main([]) == 2
    assert "needs a GPU" in capsys.readouterr().err
