"""Every script in ``bench/`` runs once on the tiny model, as a user would run it, and writes its output.

A script is found by the glob, so a new one is covered without touching this file. It declares the
arguments of its smallest run in a module-level ``TINY_ARGS`` list of strings (read here with ``ast``,
without importing it); this test adds ``--out`` (a fresh folder, which must not be empty afterwards).
``{quality_run}`` in ``TINY_ARGS`` stands for the folder of a small ``fusionrag bench quality`` run of
the tiny model, for scripts that read runs.

A script runs its ``main(argv)`` in this process (the command line it would see in ``sys.argv``), which
spares each one a fresh interpreter's imports; a lab method (``bench/methods/``) runs as its own
process, since it registers a method name for the rest of the process that runs it.
"""

import ast
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.slow  # each script runs in a process of its own (see pyproject.toml)
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(ROOT.glob("bench/**/*.py"))
TIMEOUT_S = 300  # the tiny runs take seconds; this only stops a hung one


def tiny_args(script: Path) -> list[str]:
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TINY_ARGS" for t in node.targets):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list) and all(isinstance(a, str) for a in value), f"{script}: TINY_ARGS"
            return value
    pytest.fail(f"{script.relative_to(ROOT)} declares no TINY_ARGS = [...] (the arguments of its run on tiny)")


@pytest.fixture(scope="module")
def quality_run(tmp_path_factory) -> str:
    from fusionrag_llm.cli.main import cli

    out = tmp_path_factory.mktemp("quality-run")
    args = ["bench", "quality", "--dataset", "synthetic", "--questions", "1", "--passages", "2", "--method", "fusionrag",
            "--ratio", "0.15", "--model", "tiny", "--neighbors", "1", "--max-new-tokens", "2", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return str(out)


def test_the_glob_finds_the_scripts():
    assert {"batch.py", "compare_runs.py", "kernels/speed.py"} <= {str(s.relative_to(ROOT / "bench")) for s in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: str(path.relative_to(ROOT / "bench")))
def test_runs_on_tiny_and_writes_its_output(script, request, tmp_path):
    args = tiny_args(script)
    if any("{quality_run}" in a for a in args):
        run = request.getfixturevalue("quality_run")
        args = [a.replace("{quality_run}", run) for a in args]
    out = tmp_path / "out"
    argv = [*args, "--out", str(out)]
    if script.parent.name == "methods":
        env = {**os.environ, "FUSIONRAG_STORE": str(tmp_path / "store"), "MPLBACKEND": "Agg"}
        done = subprocess.run([sys.executable, str(script), *argv], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S)  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    else:
        monkeypatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setenv("FUSIONRAG_STORE", str(tmp_path / "store"))
        monkeypatch.setenv("MPLBACKEND", "Agg")
        monkeypatch.chdir(ROOT)
        monkeypatch.syspath_prepend(str(script.parent))  # its siblings, as for `python bench/...`
        monkeypatch.setattr(sys, "argv", [str(script), *argv])
        runpy.run_path(str(script), run_name="bench_script")["main"](argv)
    written = [p for p in out.rglob("*") if p.is_file() and p.stat().st_size > 0] if out.is_dir() else []
    assert written, f"{script.name} wrote nothing into --out"
