"""Find registered chunk texts inside a flat prompt (rolling hash over a fixed window, exact check).

Framework-formatted prompts then reuse chunk KV without the framework telling us where chunks are.
"""

from __future__ import annotations

from typing import Iterable

WINDOW = 16  # chars hashed per position; shorter chunks cannot be found in flat prompts
BASE = 257
MODULUS = (1 << 61) - 1


def _hash(text: str) -> int:
    value = 0
    for char in text:
        value = (value * BASE + ord(char)) % MODULUS
    return value


class ChunkFinder:
    """Registered chunk texts, looked up by the hash of their first ``WINDOW`` characters."""

    def __init__(self) -> None:
        self._by_head: dict[int, list[str]] = {}
        self._known: set[str] = set()

    def __len__(self) -> int:
        return len(self._known)

    def __contains__(self, text: object) -> bool:
        return text in self._known

    def register(self, texts: Iterable[str]) -> None:
        for text in texts:
            if len(text) < WINDOW or text in self._known:
                continue
            self._known.add(text)
            bucket = self._by_head.setdefault(_hash(text[:WINDOW]), [])
            bucket.append(text)
            bucket.sort(key=len, reverse=True)  # the longest verified match wins

    def split(self, prompt: str) -> list[tuple[str, str]]:
        """``prompt`` as (kind, text) pieces: 'chunk' for registered texts, 'text' for the rest."""
        pieces: list[tuple[str, str]] = []
        start = 0  # start of pending plain text
        position = 0
        if len(prompt) < WINDOW or not self._known:
            return [("text", prompt)] if prompt else []
        high = pow(BASE, WINDOW - 1, MODULUS)
        rolling = _hash(prompt[:WINDOW])
        while position + WINDOW <= len(prompt):
            match = self._match_at(prompt, position, rolling)
            if match:
                if position > start:
                    pieces.append(("text", prompt[start:position]))
                pieces.append(("chunk", match))
                position = start = position + len(match)
                if position + WINDOW <= len(prompt):
                    rolling = _hash(prompt[position : position + WINDOW])
                continue
            if position + WINDOW < len(prompt):
                rolling = ((rolling - ord(prompt[position]) * high) * BASE + ord(prompt[position + WINDOW])) % MODULUS
            position += 1
        if start < len(prompt):
            pieces.append(("text", prompt[start:]))
        return pieces

    def _match_at(self, prompt: str, position: int, rolling: int) -> str | None:
        for candidate in self._by_head.get(rolling, ()):
            if prompt.startswith(candidate, position):
                return candidate
        return None
