"""The examples in docstrings are executed: every installed module with a ``>>>`` example runs here.

Examples that need the model use ``"tiny"`` (random weights, no download), so the whole file runs
in seconds; an example that cannot run on CPU is marked ``# doctest: +SKIP`` in its module.
"""

import doctest
import importlib
import io
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"kernels": "fusionrag_llm.kernels", "storage": "fusionrag_llm.storage",
          "integrations": "fusionrag_llm.integrations", "cli": "fusionrag_llm.cli"}  # fmt: skip
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
# module -> why its examples fail today (strict: the entry must go once the example passes again)
KNOWN_FAILING: dict[str, str] = {}  # module -> why its examples fail (strict xfail)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts = MAPPED.get(parts[0], parts[0]).split(".") + parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules_with_examples() -> list[str]:
    folders = ("fusionrag_llm", *MAPPED)
    paths = [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py")) if ">>> " in p.read_text()]
    return [_module_name(p) for p in paths]


def test_the_facade_examples_are_collected():
    found = set(_modules_with_examples())
    assert {"fusionrag_llm.api", "fusionrag_llm.request", "fusionrag_llm.eval.bench_data"} <= found


def _cases() -> list:
    return [pytest.param(name, marks=pytest.mark.xfail(reason=KNOWN_FAILING[name], strict=True))
            if name in KNOWN_FAILING else name for name in _modules_with_examples()]  # fmt: skip


@pytest.mark.parametrize("name", _cases())
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    monkeypatch.setenv("FUSIONRAG_STORE", str(tmp_path / "store"))
    module = importlib.import_module(name)
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in doctest.DocTestFinder().find(module, name):
        runner.run(test, out=out.write)
    assert runner.failures == 0, out.getvalue()
