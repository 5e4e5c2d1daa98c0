"""What a worker process needs to rebuild an engine's chunk entries: its model and store, as plain data.

Worker processes (``engine/ray_ingest.py``) never receive engine objects or tensors: they load the
model and reopen the store themselves from an ``EngineSpec``, and check that they arrived at the
same entry keys as the engine the spec was taken from (same weights, dtype, prefix S0, store dtype
and codec), so a worker can never write entries under keys the engine would not read.

The store travels as ``StoreSettings``: its folder, budgets, ``StoreOptions`` (as a dict: a new
option, such as the address of a remote tier, travels with it) and storage dtype. A store with a
remote tier gives its workers the same server and the secret its values are authenticated with:
what they compute lands in the shared tier too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.catalog import ChunkCatalog, catalog_file
from fusionrag_llm.fusion.entry_compute import EntryComputer
from fusionrag_llm.fusion.entry_store import EntryStore
from fusionrag_llm.models.fingerprint import fingerprint_of
from fusionrag_llm.models.loader import LoadedModel, load_model
from fusionrag_llm.storage import StoreBudgets, StoreOptions, TieredStore

TIERS = ("device", "host", "disk", "remote")  # the tiers a store opened from settings is built with


@dataclass(frozen=True)
class StoreSettings:
    """A store folder and the settings to open it with, as plain data."""

    folder: str
    budgets: dict[str, int]  # StoreBudgets fields
    options: dict = field(repr=False)  # StoreOptions fields (the remote tier's secret among them)
    storage_dtype: str | None = None  # e.g. "float16"; None: entries keep the model's dtype

    @classmethod
    def of(cls, store: TieredStore) -> StoreSettings:
        """The settings of ``store``; a store without a folder cannot be shared with other processes."""
        if store.directory is None:
            raise FusionRAGError(
                "workers= needs a store folder that the worker processes open too; this engine's store is "
                "in memory (':memory:'). Open the engine with store=<folder>, or leave workers unset to "
                "ingest in this process."
            )
        tiers = store.stats().tiers
        other = sorted(set(tiers) - set(TIERS))
        if other:
            raise FusionRAGError(f"workers= can reopen stores of the tiers {', '.join(TIERS)} only; this one also has {other}")
        budgets = {f"{name}_bytes": tiers[name].budget_bytes if name in tiers else 0 for name in TIERS}
        if budgets["device_bytes"] == 0:  # no device tier here (CPU): the default applies on a worker's GPU
            budgets["device_bytes"] = StoreBudgets().device_bytes
        dtype = None if store.storage_dtype is None else str(store.storage_dtype).removeprefix("torch.")
        return cls(str(store.directory), budgets, asdict(store.options), dtype)

    def open(self, device: torch.device) -> TieredStore:
        """The store these settings describe, for a process on ``device``."""
        dtype = None if self.storage_dtype is None else getattr(torch, self.storage_dtype)
        tier_device = device if device.type == "cuda" else None
        return TieredStore(Path(self.folder), StoreBudgets(**self.budgets), tier_device, storage_dtype=dtype,
                           options=StoreOptions(**self.options))  # fmt: skip


@dataclass(frozen=True)
class EngineSpec:
    """How to rebuild an engine's chunk entries and catalog in another process.

    ``model``: the name or absolute path it was loaded from; ``fingerprint`` and ``storage_key``:
    its model fingerprint and storage fingerprint, checked by the worker; ``s0_ids``: the canonical
    prefix its entries are computed after; ``threads``: torch threads of the worker process;
    ``tenant``: whose chunks and entries the workers compute (``""``: the default tenant's).
    """

    model: str
    device: str
    dtype: str
    kernels: str
    fingerprint: str
    storage_key: str
    s0_ids: tuple[int, ...]
    store: StoreSettings
    threads: int = 1
    tenant: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"EngineSpec.threads must be an int >= 1, got {self.threads!r}")

    @classmethod
    def of(cls, loaded: LoadedModel, entry_store: EntryStore, threads: int = 1, tenant: str = "") -> EngineSpec:
        """The spec of an engine's loaded model and its entries (``tenant``'s) in the store."""
        name = loaded.name
        if Path(name).expanduser().exists():  # a folder or file: workers may run in another folder
            name = str(Path(name).expanduser().resolve())
        model = loaded.model
        return cls(name, str(model.device), str(model.dtype).removeprefix("torch."), model.kernels,
                   fingerprint_of(loaded.name, loaded.source, loaded.hf_config, loaded.tokenizer.hf, model.dtype),
                   entry_store.keys.fingerprint, entry_store.keys.s0_ids, StoreSettings.of(entry_store.store),
                   threads, tenant)  # fmt: skip

    def build(self) -> tuple[EntryComputer, ChunkCatalog]:
        """Load the model, reopen the store and check both against the spec (in the worker process)."""
        loaded = load_model(self.model, device=self.device, dtype=self.dtype, kernels=self.kernels)
        fingerprint = fingerprint_of(loaded.name, loaded.source, loaded.hf_config, loaded.tokenizer.hf,
                                     loaded.model.dtype)  # fmt: skip
        if fingerprint != self.fingerprint:
            raise FusionRAGError(f"the worker loaded {self.model!r} as another model than the engine's "
                                 f"(fingerprint {fingerprint} != {self.fingerprint}); are its files changing?")  # fmt: skip
        store = self.store.open(loaded.model.device)
        entry_store = EntryStore.of(store, fingerprint, self.s0_ids, loaded.model.dtype, loaded.model.cfg.kv_shape)
        entry_store = EntryStore(store, entry_store.keys.for_tenant(self.tenant))
        if entry_store.keys.fingerprint != self.storage_key:
            raise FusionRAGError(f"the worker's store at {self.store.folder} keys entries as "
                                 f"{entry_store.keys.fingerprint}, the engine as {self.storage_key}")  # fmt: skip
        computer = EntryComputer(loaded.model, entry_store.keys, entry_store)
        return computer, ChunkCatalog(store.record_log(catalog_file(self.tenant)), loaded.tokenizer.encode)
