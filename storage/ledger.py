"""Byte accounting of one tier against its budget, and the choice of eviction victims (no tensors)."""

from __future__ import annotations

from collections.abc import Callable


class TierLedger:
    """Sizes of the entries one tier holds; refuses any addition that would pass the budget.

    Example:
        >>> ledger = TierLedger("host", budget_bytes=100)
        >>> ledger.add("a", 60); ledger.add("b", 30)
        >>> ledger.victims(50, heat={"a": 5.0, "b": 1.0}.get)
        ['b', 'a']
        >>> ledger.victims(50, heat={"a": 5.0, "b": 1.0}.get, colder_than=2.0) is None
        True
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

    def size_of(self, key: str) -> int:
        return self._sizes[key]

    def add(self, key: str, nbytes: int) -> None:
        """Account for `key`; `ValueError` if present already or if the budget would be passed."""
        if key in self._sizes:
            raise ValueError(f"tier {self.name!r} already holds {key!r}")
        if nbytes < 0 or self.used_bytes + nbytes > self.budget_bytes:
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
    ) -> list[str] | None:
        """Coldest keys whose removal leaves room for `nbytes`, coldest first.

        `[]` when there is room already; `None` when it cannot be done: `nbytes` passes the budget,
        or (with `colder_than`) it would need evicting a key whose heat is not below `colder_than`.
        """
        if nbytes > self.budget_bytes:
            return None
        free = self.free_bytes
        if free >= nbytes:
            return []
        chosen: list[str] = []
        for key in sorted(self._sizes, key=lambda k: heat(k) or 0.0):
            if colder_than is not None and (heat(key) or 0.0) >= colder_than:
                return None
            chosen.append(key)
            free += self._sizes[key]
            if free >= nbytes:
                return chosen
        return None
