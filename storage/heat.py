"""Heat of store entries: access count with exponential decay, on a logical clock (no tensors)."""

from __future__ import annotations


class HeatTracker:
    """Tracks how hot each key is.

    Every `touch` ticks a logical clock and adds 1 to the key's heat; heat halves every
    `half_life` ticks. A logical clock (not wall time) keeps decisions reproducible.

    Example:
        >>> heat = HeatTracker(half_life=2)
        >>> heat.touch("a"), heat.touch("b"), heat.touch("b")
        (1.0, 1.0, 2.0)
        >>> heat.heat("a") < heat.heat("b")
        True
    """

    def __init__(self, half_life: float = 1024.0, prune_every: int = 4096, prune_below: float = 1e-3):
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0, got {half_life!r}")
        if prune_every < 1:
            raise ValueError(f"prune_every must be >= 1, got {prune_every!r}")
        self._decay = 0.5 ** (1.0 / half_life)
        self._prune_every = prune_every
        self._prune_below = prune_below
        self._clock = 0
        self._state: dict[str, tuple[float, int]] = {}  # key -> (heat at tick, tick)

    @property
    def clock(self) -> int:
        return self._clock

    def __len__(self) -> int:
        return len(self._state)

    def heat(self, key: str) -> float:
        """Current heat of `key` (0.0 for a key never touched or forgotten)."""
        state = self._state.get(key)
        if state is None:
            return 0.0
        value, tick = state
        return value * self._decay ** (self._clock - tick)

    def touch(self, key: str) -> float:
        """Record one access of `key`; return its new heat."""
        value = self.heat(key) + 1.0
        self._clock += 1
        self._state[key] = (value, self._clock)
        if self._clock % self._prune_every == 0:
            self._prune()
        return value

    def forget(self, key: str) -> None:
        self._state.pop(key, None)

    def clear(self) -> None:
        self._state.clear()

    def _prune(self) -> None:
        # Keeps memory bounded: keys that cooled to ~0 are indistinguishable from unseen ones.
        cold = [key for key in self._state if self.heat(key) < self._prune_below]
        for key in cold:
            del self._state[key]
