"""Heat of store entries: access count with exponential decay, on a logical clock (memory tiers) or
on wall time (tiers shared by processes); no tensors."""

from __future__ import annotations

import math


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


# ----------------------------------------------------------------------------- shared heat (wall time)
# Tiers shared by processes (the disk folder, a remote cache) keep heat where every process sees it.
# They share no logical clock, so heat decays on wall time there, and it is kept as one number that
# orders entries like their heat does: the "heat time" `s = now + half_life_s * log2(heat(now))`, the
# moment at which the entry's decayed access count was (or will be) exactly 1. An entry written at
# `t` and never read has `s = t`, so heat order among unread entries is least-recently-used order,
# and an older index whose rows hold access times reads as entries of heat 1.


def bump_heat_time(heat_time: float | None, now: float, half_life_s: float) -> float:
    """The heat time after one more access at `now` (None: first access).

    Example:
        >>> bump_heat_time(None, 100.0, 10.0)                      # heat 1 at t=100
        100.0
        >>> bump_heat_time(100.0, 100.0, 10.0)                     # heat 2 at t=100: one half-life later
        110.0
        >>> bump_heat_time(110.0, 100.0, 10.0) > bump_heat_time(None, 115.0, 10.0)  # 3 hits beat 1 newer
        True
    """
    if not half_life_s > 0:
        raise ValueError(f"half_life_s must be > 0, got {half_life_s!r}")
    if heat_time is None:
        return float(now)
    high, low = max(heat_time, now), min(heat_time, now)
    return high + half_life_s * math.log2(1.0 + 2.0 ** ((low - high) / half_life_s))


def heat_at(heat_time: float, now: float, half_life_s: float) -> float:
    """The decayed access count at `now` of an entry with heat time `heat_time`.

    Example:
        >>> heat_at(110.0, 110.0, 10.0), heat_at(110.0, 120.0, 10.0)
        (1.0, 0.5)
    """
    return 2.0 ** ((heat_time - now) / half_life_s)
