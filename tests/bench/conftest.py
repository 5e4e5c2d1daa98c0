"""Lab scripts live in ``bench/`` (not installed); their tests load them from their files."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="session")
def load_script():
    """``load_script("kernels/tune.py")`` -> the script as a module; its folder goes on ``sys.path``
    so the script's own imports of its neighbours resolve as they do when it runs."""

    def load(relative: str):
        path = BENCH / relative
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(f"lab_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
