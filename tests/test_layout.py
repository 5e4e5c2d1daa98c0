"""The top-level folders are the architecture: each installs as a package and imports flow one way."""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"kernels": "fusionrag_llm.kernels", "storage": "fusionrag_llm.storage",
          "integrations": "fusionrag_llm.integrations", "cli": "fusionrag_llm.cli"}  # fmt: skip


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_folders() -> dict[str, Path]:
    """Every folder holding an __init__.py, keyed by the package name it installs as."""
    found = {}
    for init in ROOT.rglob("__init__.py"):
        folder = init.parent.relative_to(ROOT)
        if folder.parts[0] in ("tests", "build", "cookbook") or any(p.startswith(".") for p in folder.parts):
            continue
        top = MAPPED.get(folder.parts[0], folder.parts[0])
        found[".".join((top, *folder.parts[1:]))] = folder
    return found


def test_every_package_folder_is_listed():
    listed = set(_setuptools()["packages"])
    missing = set(_package_folders()) - listed
    assert not missing, f"package folders missing from pyproject's package list: {sorted(missing)}"


def test_package_dir_maps_the_top_level_folders():
    assert _setuptools()["package-dir"] == {name: folder for folder, name in MAPPED.items()}


def _imports(folder: str) -> set[str]:
    names = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
    return names


def test_kernels_and_storage_do_not_import_the_engine():
    for folder in ("kernels", "storage"):
        own = f"fusionrag_llm.{folder}"
        bad = {n for n in _imports(folder) if n.startswith("fusionrag_llm") and not n.startswith(own)}
        assert not bad, f"{folder}/ must depend on torch/triton/diskcache only, imports {sorted(bad)}"


def test_engine_does_not_import_integrations_or_cli():
    bad = {n for n in _imports("fusionrag_llm") if n.startswith(("fusionrag_llm.integrations", "fusionrag_llm.cli"))}
    assert not bad, f"fusionrag_llm/ must not import the adapters or the CLI: {sorted(bad)}"


def test_console_script_points_at_click_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fusionrag"] == "fusionrag_llm.cli.main:main"


def test_importing_the_package_loads_no_framework_or_index_library():
    import subprocess
    import sys

    code = ("import fusionrag_llm, sys; "
            "print([m for m in ('faiss', 'llama_index', 'langchain_core') if m in sys.modules])")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
