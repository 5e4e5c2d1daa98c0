"""Opening the KV store an engine reads and writes.

A store folder that exists but is read-only (a precomputed store shared by several users) opens
read-only; a damaged store raises ``StoreDamagedError`` naming the fix; a setting that cannot be
used raises ``StoreConfigError``. A remote URL adds the shared Redis tier after the disk, its values
authenticated with ``remote_secret`` (or, with ``remote_trusted=True``, on a trusted network: no
MAC); a URL with neither is refused. A server that cannot be reached is logged and the local tiers
serve alone. The caller supplies the defaults (the default store folder, ``$FUSIONRAG_REMOTE``,
``$FUSIONRAG_REMOTE_SECRET``): this package reads no environment.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import StoreConfigError
from .settings import StoreBudgets, StoreOptions
from .store_codec import check_kv_codec, resolve_kv_codec, store_kv_codec
from .tiered import TieredStore

MEMORY = ":memory:"
MEMORY_KV_CODEC = "model"  # a store in this process's memory only: nothing to save on disk, so exact KV
StoreSpec = TieredStore | str | Path | None


def open_store(store: StoreSpec, device: torch.device, budgets: StoreBudgets | None = None,
               remote: str | None = None, kv_codec: str | None = None, *, remote_secret: str | None = None,
               remote_trusted: bool = False) -> TieredStore:  # fmt: skip
    """A ``TieredStore`` from a folder, ``":memory:"`` or a store itself (None is the caller's to
    resolve: the default folder); ``remote``: a Redis URL for the shared tier (not for a store given),
    with ``remote_secret`` (the MAC key of its values) or ``remote_trusted=True`` (``StoreOptions``).

    ``kv_codec`` (``store_codec.py``) says how entries are kept. Not given: a folder's recorded
    codec, else ``DEFAULT_KV_CODEC`` for a new folder; ``":memory:"``: ``MEMORY_KV_CODEC``, the
    compute dtype (no disk to save, exact KV)."""
    if isinstance(store, TieredStore):
        if kv_codec is not None:
            _check_given_store(store, *_codec_settings(kv_codec), kv_codec)
        return store
    if store is None or not isinstance(store, (str, Path)):
        raise StoreConfigError(f"store must be a folder, {MEMORY!r} or a TieredStore, got {type(store).__name__}")
    requested = None if kv_codec is None else check_kv_codec(kv_codec)
    folder = None if store == MEMORY else Path(store).expanduser()
    if folder is not None:
        _make_folder(folder)
    name = store_kv_codec(folder, requested) if folder is not None else requested or MEMORY_KV_CODEC
    storage_dtype, codec_id = _codec_settings(name)
    try:
        options = StoreOptions(remote_url=remote or None, codec=codec_id, remote_secret=remote_secret,
                               remote_trusted=remote_trusted)  # fmt: skip
    except ValueError as exc:
        raise StoreConfigError(f"remote store: {exc}") from None
    tier_device = device if device.type == "cuda" else None
    try:
        return TieredStore(folder, budgets or StoreBudgets(), tier_device, storage_dtype=storage_dtype, options=options)
    except ImportError as exc:  # a remote URL without the redis client installed
        raise StoreConfigError(str(exc)) from None


def _codec_settings(kv_codec: str) -> tuple[torch.dtype | None, str]:
    """``(storage dtype, store codec id)`` of a ``kv_codec`` name."""
    dtype, codec_id = resolve_kv_codec(kv_codec)
    return (None if dtype is None else getattr(torch, dtype)), codec_id


def _check_given_store(store: TieredStore, storage_dtype, codec_id: str, kv_codec: str) -> None:
    """A store given as an object keeps its own settings: a ``kv_codec`` that disagrees is an error."""
    if (store.storage_dtype, store.codec_id) != (storage_dtype, codec_id):
        raise StoreConfigError(f"kv_codec {kv_codec!r} does not match the given store (codec {store.codec_id!r}, "
                               f"storage dtype {store.storage_dtype}); open the store with that codec or omit kv_codec")


def _make_folder(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise StoreConfigError(f"store {str(folder)!r} exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)  # an existing folder, even read-only, is fine
    except OSError as exc:
        raise StoreConfigError(
            f"cannot create the store folder {str(folder)!r}: {exc.strerror or exc}; "
            "create it yourself or choose a writable folder (--store or $FUSIONRAG_STORE)"
        ) from None
