"""The top-level folders are the architecture: each installs as a package and imports flow one way.

Layers inside ``fusionrag_llm`` (a unit is a subpackage, a top-level module, or the package root;
a unit may import itself and units of a strictly lower rank, nothing else):

====  =========================================================================================
rank  units
====  =========================================================================================
0     leaves: ``kernels`` (torch/triton), ``storage`` (torch, SQLite), ``data`` (bundled
      files); they import no other unit at all
0     base modules anyone may import: ``errors``, ``paths``, ``request``, ``options`` (the
      engine's settings), ``tool_calls``; they import only each other
1     ``models`` (model runtime)
2     ``fusion`` (chunk entries, catalog, embeddings and neighbour search, scorers, layer hooks
      of the methods)
3     ``methods`` (the ``Method`` protocol and one module per method, registered by name)
4     ``engine`` (resolve, select, sparse prefill, decode); it reads the method protocol only
      (``methods.base``), never a method's own module
5     ``api`` (the ``FusionRAG`` facade) and ``session`` (multi-turn conversations over it)
6     the package root ``fusionrag_llm`` (its public names, loaded lazily from ``_EXPORTS``),
      ``server`` (the OpenAI-compatible HTTP server, which drives the engine's step API itself)
      and ``ingest`` (the document pipeline above the facade: files to chunks, the document
      index, retrieve-and-answer)
7     ``eval`` (benchmarks: an application of the facade)
8     ``cli`` and ``integrations`` (the application layer)
====  =========================================================================================

Imports are read with ``ast``: module-level and function-level imports both count, except those
under ``if TYPE_CHECKING:``; the root's lazy export table counts as imports of the modules it names.
The CLI and the adapters reach ``models``, ``fusion``, ``methods``, ``engine`` and ``api`` only
through the root's public names.
"""

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"kernels": "fusionrag_llm.kernels", "storage": "fusionrag_llm.storage",
          "integrations": "fusionrag_llm.integrations", "cli": "fusionrag_llm.cli"}  # fmt: skip
PACKAGE = "fusionrag_llm"
BASE = ("errors", "paths", "request", "options", "tool_calls")
LEAVES = ("kernels", "storage", "data")
RANKS = {**dict.fromkeys((*BASE, *LEAVES), 0), "models": 1, "fusion": 2, "methods": 3, "engine": 4, "api": 5,
         "session": 5, PACKAGE: 6, "server": 6, "ingest": 6, "eval": 7, "cli": 8, "integrations": 8}  # fmt: skip
INTERNALS = ("models", "fusion", "methods", "engine", "api")  # the CLI and adapters use the root's names instead
# (importing unit, imported unit) edges that break the order in files owned elsewhere; each names its file.
ALLOWED: set[tuple[str, str]] = set()


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_folders() -> dict[str, Path]:
    """Every folder holding an __init__.py, keyed by the package name it installs as."""
    found = {}
    for init in ROOT.rglob("__init__.py"):
        folder = init.parent.relative_to(ROOT)
        if folder.parts[0] in ("tests", "build", "cookbook", "bench") or any(p.startswith(".") for p in folder.parts):
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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts = MAPPED.get(parts[0], parts[0]).split(".") + parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")  # fmt: skip


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level == 0:
        return [node.module]
    anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
    base = ".".join([*anchor, node.module] if node.module else anchor)
    return [base] if node.module else [f"{base}.{alias.name}" for alias in node.names]


def _walk(node: ast.AST, module: str, is_package: bool, out: list[tuple[int, str]]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                _walk(ast.Module(body=[other], type_ignores=[]), module, is_package, out)
            continue
        out.extend((child.lineno, name) for name in _imported(child, module, is_package))
        _walk(child, module, is_package, out)


def _lazy_exports(tree: ast.Module) -> list[tuple[int, str]]:
    """The modules named in the root's ``_EXPORTS`` table (imported on first attribute access)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return [(value.lineno, value.value) for value in node.value.values]
    return []


def _all_imports() -> list[tuple[str, int, str]]:
    """(importing module, line, imported module) for every in-package import of the installed folders."""
    found = []
    for folder in (PACKAGE, *(f for f in MAPPED)):
        for path in sorted((ROOT / folder).rglob("*.py")):
            module, tree = _module_name(path), ast.parse(path.read_text())
            edges: list[tuple[int, str]] = []
            _walk(tree, module, path.name == "__init__.py", edges)
            if module == PACKAGE:
                edges += _lazy_exports(tree)
            found += [(module, line, name) for line, name in edges if name.split(".")[0] == PACKAGE]
    return found


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE


def test_every_unit_has_a_rank():
    units = {_unit(m) for m, _, _ in _all_imports()} | {_unit(n) for _, _, n in _all_imports()}
    assert units <= set(RANKS), f"give these units a rank in RANKS (and the docstring): {sorted(units - set(RANKS))}"


def _violations() -> list[str]:
    bad = []
    for module, line, name in _all_imports():
        src, dst = _unit(module), _unit(name)
        if src == dst or (src, dst) in ALLOWED or (src in BASE and dst in BASE):
            continue
        leaf = src in LEAVES
        if leaf or RANKS[dst] >= RANKS[src] or (src in ("cli", "integrations") and dst in INTERNALS):
            bad.append(f"{module}:{line} imports {name} ({src} -> {dst})")
    return bad


def test_imports_follow_the_layer_order():
    bad = _violations()
    assert not bad, "imports against the layer order (see this module's docstring):\n" + "\n".join(bad)


def test_the_engine_reads_only_the_method_protocol():
    """The engine knows methods through ``methods.base`` alone: a method is a plug-in, not a branch."""
    bad = [f"{module}:{line} imports {name}" for module, line, name in _all_imports()
           if _unit(module) == "engine" and _unit(name) == "methods" and name != f"{PACKAGE}.methods.base"]  # fmt: skip
    assert not bad, "the engine imports a method's own module (use the protocol in methods.base):\n" + "\n".join(bad)


def _unit_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, _, name in _all_imports():
        if _unit(module) != _unit(name):
            graph.setdefault(_unit(module), set()).add(_unit(name))
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


def test_no_import_cycles_between_subpackages():
    cycle = _cycle(_unit_graph())
    assert cycle is None, f"import cycle between subpackages: {' -> '.join(cycle)}"


@pytest.mark.parametrize("unit", ["kernels", "fusion", "methods", "ingest"])
def test_no_import_cycles_between_modules_of(unit):
    graph: dict[str, set[str]] = {}
    for module, _, name in _all_imports():
        if _unit(module) == unit == _unit(name) and module != name:
            graph.setdefault(module, set()).add(name)
    cycle = _cycle(graph)
    assert cycle is None, f"import cycle inside {unit}/: {' -> '.join(cycle)}"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_console_script_points_at_click_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fusionrag"] == "fusionrag_llm.cli.main:main"


def test_importing_the_package_loads_no_framework_or_index_library():
    import subprocess
    import sys

    code = ("import fusionrag_llm, sys; "
            "print([m for m in ('faiss', 'llama_index', 'langchain_core', 'sentence_transformers') if m in sys.modules])")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_facade_loads_no_optional_dependency():
    import subprocess
    import sys

    code = ("from fusionrag_llm import FusionRAG, RAGRequest, method_names; import sys; "
            "print([m for m in ('faiss', 'llama_index', 'langchain_core', 'sentence_transformers') if m in sys.modules])")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_public_names_resolve():
    import fusionrag_llm

    for name in fusionrag_llm.__all__:
        assert getattr(fusionrag_llm, name) is not None, name
