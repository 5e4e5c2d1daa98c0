"""Package rules: doc examples run, and storage/ imports only torch, numpy and the stdlib."""

import ast
import doctest
import importlib
import sys
from pathlib import Path

import pytest

import fusionrag_llm.storage as storage

STORAGE_DIR = Path(storage.__file__).resolve().parent
MODULES = sorted(p.stem for p in STORAGE_DIR.glob("*.py") if p.stem != "__init__")
ALLOWED = {"torch", "numpy"} | set(sys.stdlib_module_names)
LAZY = {"redis"}  # optional clients: imported inside the function that needs them, never at module level


@pytest.mark.parametrize("name", MODULES)
def test_module_imports_stay_inside_the_allowed_set(name):
    tree = ast.parse((STORAGE_DIR / f"{name}.py").read_text())
    top_level = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots = [node.module.split(".")[0]]
        else:
            continue
        lazy_ok = id(node) not in top_level and set(roots) <= LAZY
        assert set(roots) <= ALLOWED or lazy_ok, f"storage/{name}.py imports {roots}"


def test_storage_imports_without_the_redis_client_and_says_what_to_install(tmp_path):
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "from fusionrag_llm.storage import StoreOptions, TieredStore\n"
        "options = StoreOptions(remote_url='redis://127.0.0.1:1/0', remote_trusted=True)\n"
        "try:\n    TieredStore(sys.argv[1], options=options)\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pip install 'fusionrag-llm[remote]'" in out.stdout


@pytest.mark.parametrize("name", MODULES)
def test_doc_examples_run(name):
    module = importlib.import_module(f"fusionrag_llm.storage.{name}")
    result = doctest.testmod(module)
    assert result.failed == 0


def test_public_names_are_exported():
    for name in storage.__all__:
        assert hasattr(storage, name), name
    assert storage.__doc__.startswith("Content-addressed, tiered store of KV entries.")
