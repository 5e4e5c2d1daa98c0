"""Opening the KV store a ``FusionRAG`` reads and writes.

A store folder that exists but is read-only (a precomputed store shared by several users) opens
read-only; a damaged store raises ``DamagedStoreError``, which is both the store's
``StoreDamagedError`` and a ``FusionRAGError``, so user-facing code reports it like other bad input.
A remote URL (``remote=``, else ``$FUSIONRAG_REMOTE``) adds the shared Redis tier after the disk; a
server that cannot be reached is logged and the local tiers serve alone.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.models.loader import resolve_dtype
from fusionrag_llm.engine.kv_codecs import check_kv_codec, kv_codec_of, resolve_kv_codec
from fusionrag_llm.engine.store_codec import store_kv_codec
from fusionrag_llm.paths import remote_url, store_dir
from fusionrag_llm.storage import StoreBudgets, StoreDamagedError, StoreOptions, TieredStore

MEMORY = ":memory:"
MEMORY_KV_CODEC = "model"  # a store in this process's memory only: nothing to save on disk, so exact KV
StoreSpec = TieredStore | str | Path | None


class DamagedStoreError(FusionRAGError, StoreDamagedError):
    """The store's index is damaged; the message names the file and the commands that fix it."""


def open_store(store: StoreSpec, device: torch.device, store_dtype=None, budgets: StoreBudgets | None = None,
               remote: str | None = None, kv_codec: str | None = None) -> TieredStore:  # fmt: skip
    """A ``TieredStore`` from a folder (None: the default folder), ``":memory:"`` or a store itself;
    ``remote``: a Redis URL for the shared tier (default ``$FUSIONRAG_REMOTE``; not for a store given).

    ``kv_codec`` (``engine/kv_codecs.py``) and ``store_dtype`` both say how entries are kept; give
    one. Neither given: a folder's recorded codec (``engine/store_codec.py``), else ``DEFAULT_KV_CODEC``
    for a new folder; ``":memory:"``: ``MEMORY_KV_CODEC``, the compute dtype (no disk to save, exact KV)."""
    if kv_codec is not None and store_dtype is not None:
        raise FusionRAGError(f"give kv_codec ({kv_codec!r}) or store_dtype ({store_dtype!r}), not both")
    if isinstance(store, TieredStore):
        if kv_codec is not None:
            dtype, codec_id = resolve_kv_codec(kv_codec)
            _check_given_store(store, None if dtype is None else resolve_dtype(dtype, device), codec_id, kv_codec)
        return store
    if store is not None and store != MEMORY and not isinstance(store, (str, Path)):
        raise FusionRAGError(f"store must be a folder, {MEMORY!r} or a TieredStore, got {type(store).__name__}")
    storage_dtype = None if store_dtype is None else resolve_dtype(store_dtype, device)
    requested = check_kv_codec(kv_codec) if kv_codec is not None else _codec_of_dtype(storage_dtype)
    folder = None if store == MEMORY else (Path(store).expanduser() if store is not None else store_dir())
    if folder is not None:
        _make_folder(folder)
    codec_id = "raw"
    if store_dtype is None or requested is not None:  # a store_dtype without a codec name is kept as given
        name = store_kv_codec(folder, requested) if folder is not None else requested or MEMORY_KV_CODEC
        dtype, codec_id = resolve_kv_codec(name)
        storage_dtype = None if dtype is None else resolve_dtype(dtype, device)
    budgets = budgets or StoreBudgets()
    tier_device = device if device.type == "cuda" else None
    options = _options(remote if remote is not None else remote_url(), codec_id)
    try:
        return _opened(folder, budgets, tier_device, storage_dtype, options)
    except StoreDamagedError as exc:
        raise DamagedStoreError(exc.directory, exc.problem) from exc


def _codec_of_dtype(storage_dtype: torch.dtype | None) -> str | None:
    """The ``kv_codec`` name of an older ``store_dtype`` argument (None: none given, or no name fits)."""
    return None if storage_dtype is None else kv_codec_of(str(storage_dtype).removeprefix("torch."), "raw")


def _options(remote: str | None, codec_id: str) -> StoreOptions:
    try:
        return StoreOptions(remote_url=remote or None, codec=codec_id)
    except ValueError as exc:
        raise FusionRAGError(f"remote store: {exc}") from None


def _opened(folder: Path | None, budgets: StoreBudgets, device, storage_dtype, options: StoreOptions) -> TieredStore:
    try:
        return TieredStore(folder, budgets, device, storage_dtype=storage_dtype, options=options)
    except ImportError as exc:  # a remote URL without the redis client installed
        raise FusionRAGError(str(exc)) from None


def _check_given_store(store: TieredStore, storage_dtype, codec_id: str, kv_codec: str | None) -> None:
    """A store given as an object keeps its own settings: a ``kv_codec`` that disagrees is an error."""
    if kv_codec is not None and (store.storage_dtype, store.codec_id) != (storage_dtype, codec_id):
        raise FusionRAGError(f"kv_codec {kv_codec!r} does not match the given store (codec {store.codec_id!r}, "
                             f"storage dtype {store.storage_dtype}); open the store with that codec or omit kv_codec")


def _make_folder(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise FusionRAGError(f"store {str(folder)!r} exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)  # an existing folder, even read-only, is fine
    except OSError as exc:
        raise FusionRAGError(
            f"cannot create the store folder {str(folder)!r}: {exc.strerror or exc}; "
            "create it yourself or choose a writable folder (--store or $FUSIONRAG_STORE)"
        ) from None
