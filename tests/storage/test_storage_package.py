"""Package rules: doc examples run, and storage/ imports only torch, diskcache, numpy, stdlib."""

import ast
import doctest
import importlib
import sys
from pathlib import Path

import pytest

import fusionrag_llm.storage as storage

STORAGE_DIR = Path(storage.__file__).resolve().parent
MODULES = sorted(p.stem for p in STORAGE_DIR.glob("*.py") if p.stem != "__init__")
ALLOWED = {"torch", "diskcache", "numpy"} | set(sys.stdlib_module_names)


@pytest.mark.parametrize("name", MODULES)
def test_module_imports_stay_inside_the_allowed_set(name):
    tree = ast.parse((STORAGE_DIR / f"{name}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots = [node.module.split(".")[0]]
        else:
            continue
        assert set(roots) <= ALLOWED, f"storage/{name}.py imports {roots}"


@pytest.mark.parametrize("name", MODULES)
def test_doc_examples_run(name):
    module = importlib.import_module(f"fusionrag_llm.storage.{name}")
    result = doctest.testmod(module)
    assert result.failed == 0


def test_public_names_are_exported():
    for name in storage.__all__:
        assert hasattr(storage, name), name
    assert storage.__doc__.startswith("Content-addressed, tiered store of KV entries.")
