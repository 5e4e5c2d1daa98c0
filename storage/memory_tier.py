"""Memory tiers: entries held as tensors in host memory or on a torch device, within a byte budget."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .entry import KVEntry
from .ledger import TierLedger


class MemoryTier:
    """A dict of `KVEntry` whose tensors live on `device`, never holding more than `budget_bytes`.

    `put` takes ownership of the entry: the tier keeps the tensors it is given when they are already
    on its device (the caller must not keep and modify them), and copies them there otherwise.
    Eviction policy lives in the caller; this class only offers `victims` and refuses overflows.

    Example:
        >>> import torch
        >>> tier = MemoryTier("host", budget_bytes=1024)
        >>> e = KVEntry((1, 2), torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8))
        >>> _ = tier.put("k", e); tier.used_bytes
        128
    """

    def __init__(self, name: str, budget_bytes: int, device: torch.device | str = "cpu", pin: bool = False):
        self.name = name
        self.device = torch.device(device)
        self.pin = pin  # host memory the GPU copies from without staging (asynchronous copies)
        self._ledger = TierLedger(name, budget_bytes)
        self._entries: dict[str, KVEntry] = {}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, entries={len(self)}, "
            f"used={self.used_bytes}/{self.budget_bytes} B, device={self.device})"
        )

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[str]:
        return list(self._entries)

    @property
    def budget_bytes(self) -> int:
        return self._ledger.budget_bytes

    @property
    def used_bytes(self) -> int:
        return self._ledger.used_bytes

    def get(self, key: str) -> KVEntry | None:
        return self._entries.get(key)

    @property
    def overshoot_bytes(self) -> int:
        return self._ledger.overshoot_bytes

    def put(self, key: str, entry: KVEntry, *, over_budget: bool = False) -> KVEntry:
        """Hold `entry` on this tier's device; return the held entry. `ValueError` if it does not fit
        (unless `over_budget`, see `TierLedger.add`)."""
        self._ledger.add(key, entry.nbytes, over_budget=over_budget)
        try:
            held = _pinned(entry.to(self.device)) if self.pin else entry.to(self.device)
        except Exception:
            self._ledger.remove(key)
            raise
        self._entries[key] = held
        return held

    def pop(self, key: str) -> KVEntry | None:
        self._ledger.remove(key)
        return self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()
        self._ledger.clear()

    def victims(
        self,
        nbytes: int,
        heat: Callable[[str], float],
        colder_than: float | None = None,
        pinned: Callable[[str], bool] | None = None,
    ) -> list[str] | None:
        """See `TierLedger.victims`."""
        return self._ledger.victims(nbytes, heat, colder_than, pinned)

    def evictable(self, heat: Callable[[str], float], pinned: Callable[[str], bool] | None = None) -> list[str]:
        """See `TierLedger.evictable`."""
        return self._ledger.evictable(heat, pinned)


class HostTier(MemoryTier):
    """Host (CPU) memory tier. `pin`: hold entries in page-locked memory (needs CUDA), which a GPU
    reads with asynchronous copies (a store beside a CUDA model pins its host tier)."""

    def __init__(self, budget_bytes: int, name: str = "host", pin: bool = False):
        if pin and not torch.cuda.is_available():
            raise ValueError("HostTier(pin=True) needs CUDA: page-locked memory is for GPU copies")
        super().__init__(name, budget_bytes, "cpu", pin)


def _pinned(entry: KVEntry) -> KVEntry:
    """`entry` with its tensors in page-locked host memory (itself when they already are)."""
    if entry.keys.is_pinned():
        return entry
    extras = {name: tensor.pin_memory() for name, tensor in entry.extras.items()}
    return KVEntry(entry.token_ids, entry.keys.pin_memory(), entry.values.pin_memory(), entry.meta, extras)


class DeviceTier(MemoryTier):
    """Accelerator memory tier (CUDA); `ValueError` for a CPU device or when CUDA is unavailable."""

    def __init__(self, budget_bytes: int, device: torch.device | str = "cuda", name: str = "device"):
        device = torch.device(device)
        if device.type == "cpu":
            raise ValueError("DeviceTier needs an accelerator device such as 'cuda'; use HostTier for CPU")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"DeviceTier on {device} requested but torch.cuda.is_available() is False")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        super().__init__(name, budget_bytes, device)
