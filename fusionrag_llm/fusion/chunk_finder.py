"""Find registered chunk texts inside a flat prompt (rolling hash over a fixed window, exact check).

Framework-formatted prompts then reuse chunk KV without the framework telling us where chunks are.

Finding a chunk must not change the prompt. A match found by characters alone may cut a token of
the prompt in two (a registered text followed by letters, or sitting inside a word, or after a
space that the prompt's tokenizer glues to its first word); tokenizing it on its own would then
change the ids the model sees, and so its output even under full attention. ``split_tokens``
therefore takes a match as a chunk only where it starts and ends on token boundaries of the
prompt's own tokenization and the tokens between are exactly the chunk's own ids; every piece's
ids are a slice of that one tokenization, so the concatenated ids never depend on what is registered.
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol, Sequence

WINDOW = 16  # chars hashed per position; shorter texts are not registered at all
BASE = 257
MODULUS = (1 << 61) - 1
# Flat prompts take a registered text as a chunk only from this size on: a short text (a name, a
# title) recurs in prompts by coincidence, and reusing its context-free KV saves little prefill.
MIN_CHUNK_CHARS = 32
MIN_CHUNK_TOKENS = 8

Piece = tuple[str, str, tuple[int, ...]]  # (kind 'chunk' or 'text', text, token ids)


class Tokenized(Protocol):
    """A prompt's own tokenization (``ChatTokenizer.tokenize``)."""

    text: str
    ids: list[int]

    def index_at(self, char: int) -> int | None: ...


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
        """``prompt`` as (kind, text) pieces by characters alone: 'chunk' for registered texts, 'text' for the rest."""
        pieces: list[tuple[str, str]] = []
        start = 0
        for position, text in self.matches(prompt):
            if position > start:
                pieces.append(("text", prompt[start:position]))
            pieces.append(("chunk", text))
            start = position + len(text)
        if start < len(prompt):
            pieces.append(("text", prompt[start:]))
        return pieces

    def split_tokens(self, tokens: Tokenized, chunk_ids: Callable[[str], Sequence[int] | None]) -> list[Piece]:
        """``tokens.text`` as (kind, text, ids) pieces whose ids concatenate to exactly ``tokens.ids``.

        ``chunk_ids(text)`` gives a registered text's own ids (as ingestion tokenized it). A match
        becomes a chunk only if it has at least ``MIN_CHUNK_CHARS`` characters and
        ``MIN_CHUNK_TOKENS`` tokens, starts and ends on token boundaries of ``tokens``, and the
        tokens there equal its own ids; anything else stays text with the prompt's own ids.
        """
        spans: dict[int, tuple[int, int]] = {}

        def accept(start: int, text: str) -> bool:
            span = _token_span(tokens, start, text, chunk_ids(text))
            if span is not None:
                spans[start] = span
            return span is not None

        pieces: list[Piece] = []
        char = token = 0
        for start, text in self.matches(tokens.text, accept):
            first, last = spans[start]
            if start > char or first > token:
                pieces.append(("text", tokens.text[char:start], tuple(tokens.ids[token:first])))
            pieces.append(("chunk", text, tuple(tokens.ids[first:last])))
            char, token = start + len(text), last
        if char < len(tokens.text) or token < len(tokens.ids):
            pieces.append(("text", tokens.text[char:], tuple(tokens.ids[token:])))
        return pieces

    def matches(self, prompt: str, accept: Callable[[int, str], bool] | None = None) -> list[tuple[int, str]]:
        """Non-overlapping ``(start, text)`` of registered texts in ``prompt``, left to right.

        At each position the longest registered text that ``accept(start, text)`` allows wins.
        """
        found: list[tuple[int, str]] = []
        if len(prompt) < WINDOW or not self._known:
            return found
        high = pow(BASE, WINDOW - 1, MODULUS)
        position, rolling = 0, _hash(prompt[:WINDOW])
        while position + WINDOW <= len(prompt):
            match = self._match_at(prompt, position, rolling, accept)
            if match:
                found.append((position, match))
                position += len(match)
                if position + WINDOW <= len(prompt):
                    rolling = _hash(prompt[position : position + WINDOW])
                continue
            if position + WINDOW < len(prompt):
                rolling = ((rolling - ord(prompt[position]) * high) * BASE + ord(prompt[position + WINDOW])) % MODULUS
            position += 1
        return found

    def _match_at(self, prompt: str, position: int, rolling: int, accept) -> str | None:
        for candidate in self._by_head.get(rolling, ()):
            if prompt.startswith(candidate, position) and (accept is None or accept(position, candidate)):
                return candidate
        return None


def _token_span(tokens: Tokenized, start: int, text: str, ids: Sequence[int] | None) -> tuple[int, int] | None:
    """Token indices ``[first, last)`` of ``text`` at ``start`` when it may be taken as a chunk, else None."""
    if ids is None or len(text) < MIN_CHUNK_CHARS or len(ids) < MIN_CHUNK_TOKENS:
        return None
    first, last = tokens.index_at(start), tokens.index_at(start + len(text))
    if first is None or last is None or tuple(tokens.ids[first:last]) != tuple(ids):
        return None
    return first, last
