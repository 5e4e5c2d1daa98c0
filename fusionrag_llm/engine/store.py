"""Opening the KV store a ``FusionRAG`` reads and writes."""

from __future__ import annotations

from pathlib import Path

import torch

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.models.loader import resolve_dtype
from fusionrag_llm.paths import store_dir
from fusionrag_llm.storage import StoreBudgets, TieredStore

MEMORY = ":memory:"
StoreSpec = TieredStore | str | Path | None


def open_store(store: StoreSpec, device: torch.device, store_dtype=None, budgets: StoreBudgets | None = None) -> TieredStore:
    """A ``TieredStore`` from a folder (None: the default folder), ``":memory:"`` or a store itself."""
    if isinstance(store, TieredStore):
        return store
    storage_dtype = None if store_dtype is None else resolve_dtype(store_dtype, device)
    budgets = budgets or StoreBudgets()
    tier_device = device if device.type == "cuda" else None
    if store == MEMORY:
        return TieredStore(None, budgets, tier_device, storage_dtype=storage_dtype)
    if store is not None and not isinstance(store, (str, Path)):
        raise FusionRAGError(f"store must be a folder, {MEMORY!r} or a TieredStore, got {type(store).__name__}")
    folder = Path(store).expanduser() if store is not None else store_dir()
    if folder.exists() and not folder.is_dir():
        raise FusionRAGError(f"store {str(folder)!r} exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    return TieredStore(folder, budgets, tier_device, storage_dtype=storage_dtype)
