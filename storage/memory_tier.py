"""Memory tiers: entries held as tensors in host memory or on a torch device, within a byte budget.

`TierLedger` is a tier's byte accounting and its choice of eviction victims (no tensors); a
`MemoryTier` is a ledger that also holds the entries. Pinned keys (see `pins.py`) are never chosen as
victims. When only pinned keys stand in the way of an entry that has no other home, the caller may
add it over the budget (`add(..., over_budget=True)`): `overshoot_bytes` then says by how much the
tier is over, until unpinned entries can go.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .entry import KVEntry


class TierLedger:
    """Sizes of the entries one tier holds; refuses any addition that would pass the budget.

    Example:
        >>> ledger = TierLedger("host", budget_bytes=100)
        >>> ledger.add("a", 60); ledger.add("b", 30)
        >>> ledger.victims(50, heat={"a": 5.0, "b": 1.0}.get)
        ['b', 'a']
        >>> ledger.victims(50, heat={"a": 5.0, "b": 1.0}.get, colder_than=2.0) is None
        True
        >>> ledger.victims(50, heat={"a": 5.0, "b": 1.0}.get, pinned={"b"}.__contains__)
        ['a']
    """

    def __init__(self, name: str, budget_bytes: int):
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"budget of tier {name!r} must be an int >= 0 (bytes), got {budget_bytes!r}")
        self.name = name
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self._sizes: dict[str, int] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def keys(self) -> list[str]:
        return list(self._sizes)

    @property
    def free_bytes(self) -> int:
        return self.budget_bytes - self.used_bytes

    @property
    def overshoot_bytes(self) -> int:
        """Bytes held beyond the budget (only ever after `add(..., over_budget=True)`)."""
        return max(0, self.used_bytes - self.budget_bytes)

    def add(self, key: str, nbytes: int, *, over_budget: bool = False) -> None:
        """Account for `key`; `ValueError` if present already or if the budget would be passed
        (unless `over_budget`: pinned entries leave no room and the entry has no other home)."""
        if key in self._sizes:
            raise ValueError(f"tier {self.name!r} already holds {key!r}")
        if nbytes < 0 or (self.used_bytes + nbytes > self.budget_bytes and not over_budget):
            raise ValueError(
                f"tier {self.name!r}: adding {nbytes} bytes to {self.used_bytes} passes the budget "
                f"of {self.budget_bytes}; make room first (see victims)"
            )
        self._sizes[key] = nbytes
        self.used_bytes += nbytes

    def remove(self, key: str) -> int:
        """Forget `key`; return the bytes it held (0 when absent)."""
        nbytes = self._sizes.pop(key, 0)
        self.used_bytes -= nbytes
        return nbytes

    def clear(self) -> None:
        self._sizes.clear()
        self.used_bytes = 0

    def victims(
        self,
        nbytes: int,
        heat: Callable[[str], float | None],
        colder_than: float | None = None,
        pinned: Callable[[str], bool] | None = None,
    ) -> list[str] | None:
        """Coldest keys whose removal leaves room for `nbytes`, coldest first, never a `pinned` one.

        `[]` when there is room already; `None` when it cannot be done: `nbytes` passes the budget,
        (with `colder_than`) it would need evicting a key whose heat is not below `colder_than`, or
        the keys left after skipping pinned ones do not free enough.
        """
        if nbytes > self.budget_bytes:
            return None
        free = self.free_bytes
        if free >= nbytes:
            return []
        chosen: list[str] = []
        for key in self.evictable(heat, pinned):
            if colder_than is not None and (heat(key) or 0.0) >= colder_than:
                return None
            chosen.append(key)
            free += self._sizes[key]
            if free >= nbytes:
                return chosen
        return None

    def evictable(self, heat: Callable[[str], float | None], pinned: Callable[[str], bool] | None = None) -> list[str]:
        """Keys that may be evicted (not `pinned`), coldest first."""
        keys = self._sizes if pinned is None else [key for key in self._sizes if not pinned(key)]
        return sorted(keys, key=lambda k: heat(k) or 0.0)


class MemoryTier(TierLedger):
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
        super().__init__(name, budget_bytes)
        self.device = torch.device(device)
        self.pin = pin  # host memory the GPU copies from without staging (asynchronous copies)
        self._entries: dict[str, KVEntry] = {}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, entries={len(self)}, "
            f"used={self.used_bytes}/{self.budget_bytes} B, device={self.device})"
        )

    def get(self, key: str) -> KVEntry | None:
        return self._entries.get(key)

    def put(self, key: str, entry: KVEntry, *, over_budget: bool = False) -> KVEntry:
        """Hold `entry` on this tier's device; return the held entry. `ValueError` if it does not fit
        (unless `over_budget`, see `TierLedger.add`)."""
        self.add(key, entry.nbytes, over_budget=over_budget)
        try:
            held = _pinned(entry.to(self.device)) if self.pin else entry.to(self.device)
        except Exception:
            self.remove(key)
            raise
        self._entries[key] = held
        return held

    def pop(self, key: str) -> KVEntry | None:
        self.remove(key)
        return self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()
        super().clear()


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
