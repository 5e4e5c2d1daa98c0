"""Where the project keeps its files on the user's machine."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$FUSIONRAG_CACHE``, else ``$XDG_CACHE_HOME/fusionrag_llm``, else ``~/.cache/fusionrag_llm``."""
    explicit = os.environ.get("FUSIONRAG_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "fusionrag_llm"


def store_dir() -> Path:
    """The default KV store folder: ``$FUSIONRAG_STORE``, else ``<cache_dir()>/store``."""
    explicit = os.environ.get("FUSIONRAG_STORE")
    return Path(explicit).expanduser() if explicit else cache_dir() / "store"


def remote_url() -> str | None:
    """The shared remote KV tier's server: ``$FUSIONRAG_REMOTE`` (e.g. ``redis://127.0.0.1:6379/0``), else None."""
    return os.environ.get("FUSIONRAG_REMOTE") or None
