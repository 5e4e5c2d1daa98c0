"""Where the project keeps its files on the user's machine."""

from __future__ import annotations

import os
from pathlib import Path

from fusionrag_llm.errors import FusionRAGError


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


def remote_secret() -> str | None:
    """The MAC key of the remote tier's values: ``$FUSIONRAG_REMOTE_SECRET``, else None."""
    return os.environ.get("FUSIONRAG_REMOTE_SECRET") or None


def remote_trusted() -> bool:
    """Whether ``$FUSIONRAG_REMOTE_TRUSTED`` declares the remote tier's network trusted (``1``/``true``/``yes``;
    unset, empty, ``0``/``false``/``no``: not); any other value is a ``FusionRAGError``."""
    value = os.environ.get("FUSIONRAG_REMOTE_TRUSTED", "").strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("", "0", "false", "no"):
        return False
    raise FusionRAGError(f"$FUSIONRAG_REMOTE_TRUSTED must be 1, true, yes, 0, false or no, got {value!r}")
