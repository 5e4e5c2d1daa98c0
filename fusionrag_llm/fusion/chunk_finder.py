"""Find registered chunk texts inside a flat prompt (rolling hash over a fixed window, exact check).

Framework-formatted prompts then reuse chunk KV without the framework telling us where chunks are.

Finding a chunk must not change the prompt. A match found by characters alone may cut a token of
the prompt in two (a registered text followed by letters, or sitting inside a word, or after a
space that the prompt's tokenizer glues to its first word); tokenizing it on its own would then
change the ids the model sees, and so its output even under full attention. ``split_tokens``
therefore takes a match as a chunk only where it starts and ends on token boundaries of the
prompt's own tokenization and the tokens between are exactly the chunk's own ids; every piece's
ids are a slice of that one tokenization, so the concatenated ids never depend on what is registered.

One cut is taken anyway, because templates make it all the time: whitespace glued to the chunk's
first word (LlamaIndex's indented context prompt puts "\n\n  " before the first node, and a BPE
tokenizer reads " The" where the chunk alone starts "The"). Where the prompt's token before the
chunk decodes to whitespace and the text of the chunk's first ``k`` ids, and the chunk's ids from
the ``k``-th on follow it, the chunk is found from its ``k``-th id on: the glued token stays text
(computed), and the chunk's stored KV serves the rest (``Piece.glued_ids`` keeps the ids it skips).
"""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple, Protocol, Sequence

WINDOW = 16  # chars hashed per position; shorter texts are not registered at all
BASE = 257
MODULUS = (1 << 61) - 1
# Flat prompts take a registered text as a chunk only from this size on: a short text (a name, a
# title) recurs in prompts by coincidence, and reusing its context-free KV saves little prefill.
MIN_CHUNK_CHARS = 32
MIN_CHUNK_TOKENS = 8


class Piece(NamedTuple):
    kind: str  # 'chunk' or 'text'
    text: str  # a chunk's registered text; the prompt's text otherwise
    token_ids: tuple[int, ...]  # the prompt's own ids
    # a chunk's own first ids that the prompt holds inside the token before it (glued to whitespace):
    # the chunk's ids are ``glued_ids + token_ids``; () where the prompt holds all of them
    glued_ids: tuple[int, ...] = ()


class Tokenized(Protocol):
    """A prompt's own tokenization (``ChatTokenizer.tokenize``)."""

    text: str
    ids: list[int]

    def index_at(self, char: int) -> int | None: ...

    def decode(self, ids: Sequence[int]) -> str: ...


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
        """``tokens.text`` as pieces whose ids concatenate to exactly ``tokens.ids``.

        ``chunk_ids(text)`` gives a registered text's own ids (as ingestion tokenized it). A match
        becomes a chunk only if it has at least ``MIN_CHUNK_CHARS`` characters and
        ``MIN_CHUNK_TOKENS`` tokens, starts and ends on token boundaries of ``tokens``, and the
        tokens there equal its own ids, or its first word is glued to the whitespace before it (see
        the module's docstring); anything else stays text with the prompt's own ids.
        """
        spans: dict[int, _Span] = {}
        taken = 0  # tokens up to the end of the last chunk taken: a glued token is never one of them

        def accept(start: int, text: str) -> bool:
            nonlocal taken
            span = _token_span(tokens, start, text, chunk_ids(text))
            if span is None or span.first - (1 if span.glued else 0) < taken:
                return False
            spans[start], taken = span, span.last
            return True

        pieces: list[Piece] = []
        char = token = 0
        for start, text in self.matches(tokens.text, accept):
            span = spans[start]
            if start > char or span.first > token:
                pieces.append(Piece("text", tokens.text[char:start], tuple(tokens.ids[token : span.first])))
            pieces.append(Piece("chunk", text, tuple(tokens.ids[span.first : span.last]), span.glued))
            char, token = start + len(text), span.last
        if char < len(tokens.text) or token < len(tokens.ids):
            pieces.append(Piece("text", tokens.text[char:], tuple(tokens.ids[token:])))
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


class _Span(NamedTuple):
    first: int  # the prompt's token index of the chunk's first id taken
    last: int  # one past its last
    glued: tuple[int, ...]  # the chunk's ids before ``first`` that the prompt glued into token ``first - 1``


def _token_span(tokens: Tokenized, start: int, text: str, ids: Sequence[int] | None) -> _Span | None:
    """Where ``text`` at ``start`` may be taken as a chunk in ``tokens``, else None."""
    if ids is None or len(text) < MIN_CHUNK_CHARS or len(ids) < MIN_CHUNK_TOKENS:
        return None
    first, last = tokens.index_at(start), tokens.index_at(start + len(text))
    if last is None:
        return None
    if first is not None and tuple(tokens.ids[first:last]) == tuple(ids):
        return _Span(first, last, ())
    return _glued_span(tokens, start, text, ids, last)


def _glued_span(tokens: Tokenized, start: int, text: str, ids: Sequence[int], last: int) -> _Span | None:
    """The span of ``text`` from its ``k``-th id on, where the prompt's token before it decodes to
    whitespace followed by the text of the chunk's first ``k`` ids (e.g. " The" where the chunk
    alone starts "The", or " passage" where it starts "pass", "age"); None where it does not."""
    begin = start  # the boundary the glued token starts at: back over whitespace only
    while tokens.index_at(begin) is None:
        if begin == 0 or not tokens.text[begin - 1].isspace():
            return None
        begin -= 1
    glued = tokens.index_at(begin)
    if glued is None or glued >= last:
        return None
    decoded = tokens.decode(tokens.ids[glued : glued + 1])
    head = decoded[start - begin :]  # what the glued token holds of the chunk's text
    if decoded[: start - begin] != tokens.text[begin:start] or not head or not text.startswith(head):
        return None
    k = _ids_spelling(tokens, ids, head)
    if k is None or tokens.index_at(start + len(head)) != glued + 1:
        return None
    if tuple(tokens.ids[glued + 1 : last]) != tuple(ids[k:]):
        return None
    return _Span(glued + 1, last, tuple(ids[:k]))


def _ids_spelling(tokens: Tokenized, ids: Sequence[int], head: str) -> int | None:
    """The ``k`` (less than ``len(ids)``) with ``ids[:k]`` decoding to exactly ``head``, or None."""
    for k in range(1, len(ids)):
        decoded = tokens.decode(ids[:k])
        if len(decoded) >= len(head):
            return k if decoded == head else None
    return None
