"""Retrieved context a formatted prompt should carry: found there as registered, or said to be missing.

The engine finds registered chunk texts in a prompt by content. When a framework formats the retrieved
text in another form, nothing is found and every chunk is computed, which looks like a slow model
rather than an error. Known causes: LlamaIndex's ``response_mode="simple_summarize"`` passes the
context as a list, whose Python repr escapes newlines and quotes; a custom template (or a function
mapping) may rewrite the text; or the prompt holds the text unchanged, but the characters next to it
join its first or last characters into other tokens than it has alone (a letter before it, a word
run on after it). The first is undone: the list's repr in the prompt is replaced by its items as
text, which the prompt meant to hold, and kept only when the engine then finds the chunks (their
tokens equal the registered ones). Whitespace glued to a chunk's first word is no cause: the engine
finds the chunk all the same. What stays unfound is counted and logged once per cause.

Framework-free on purpose, like ``_shared``.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations._shared import for_tenant

logger = logging.getLogger(__name__)

LIST_REPR = "list_repr"  # the context went into the prompt as a Python list repr
REWRITTEN = "rewritten"  # the prompt does not hold the text of some registered chunks of the context
TOKEN_EDGES = "token_edges"  # it holds their text, but the text next to it changes the tokens at its edges
UNREGISTERED = "unregistered"  # the context holds no registered chunk at all
UNDONE = "list_repr_undone"  # a list repr was replaced by its items and the chunks were found

_MESSAGES = {
    LIST_REPR: "%d of %d retrieved chunks are not reused: the context was formatted into the prompt as a Python "
    "list, whose repr escapes their text, and they were not found after undoing it either",
    REWRITTEN: "%d of %d retrieved chunks are not reused: the prompt does not hold their text as it was "
    "registered (a custom template or function mapping may rewrite it); register the text the prompt "
    "holds, or format the context unchanged",
    TOKEN_EDGES: "%d of %d retrieved chunks are not reused: the prompt holds their text, but the characters "
    "right before or after it join its first or last characters into other tokens than the chunk has on its "
    "own (e.g. a letter or punctuation mark next to it); put a line break between the context and the text "
    "around it",
    UNREGISTERED: "the retrieved context holds no registered chunk, so nothing is reused; register nodes as "
    "they are indexed (FusionRAGIngestion) with the text the synthesizer formats",
    UNDONE: "the retrieved context came as a Python list (e.g. response_mode='simple_summarize'); its repr in "
    "the prompt was replaced by the items' text so that their KV caches are reused",
}


@dataclass(frozen=True)
class CheckedRequest:
    request: Any  # what to send: the formatted request, or it with the context's list repr replaced
    expected: int  # registered chunks in the retrieved context
    unmatched: int  # of those, the ones the request does not hold as registered (so not reused)
    cause: Optional[str]  # what to say (a key of _MESSAGES), or None


def context_text(value: Any) -> Optional[str]:
    """The text a context value stands for: a string, or a list's items joined as the synthesizer joins them."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(item, str) for item in value):
        return "\n".join(value)
    return None


def check_request(rag: FusionRAG, request: Any, context: Any, replace: Callable[[Any, str, str], Any],
                  tenant: str | None = None) -> CheckedRequest:  # fmt: skip
    """``request`` (as the engine takes it) checked against the retrieved ``context`` it was formatted with,
    both read for ``tenant`` (its registered chunks only; None: the default tenant).

    ``replace(request, old, new)`` returns the request with ``old`` replaced by ``new`` in its texts.
    """
    text = context_text(context)
    expected = count_chunks(rag, text, tenant) if text and text.strip() else 0
    if not expected:
        return CheckedRequest(request, 0, 0, UNREGISTERED if text and text.strip() else None)
    found = count_chunks(rag, request, tenant)
    if found >= expected:
        return CheckedRequest(request, expected, 0, None)
    if isinstance(context, (list, tuple)):  # formatted as str(context): its repr
        undone = replace(request, str(context), text)
        found_undone = count_chunks(rag, undone, tenant) if undone != request else 0
        if found_undone > found:
            cause = UNDONE if found_undone >= expected else LIST_REPR
            return CheckedRequest(undone, expected, expected - found_undone, cause)
        return CheckedRequest(request, expected, expected - found, LIST_REPR)
    return CheckedRequest(request, expected, expected - found, _unfound_cause(rag, text, request, tenant))


def count_chunks(rag: FusionRAG, request: Any, tenant: str | None = None) -> int:
    """Chunks registered under ``tenant`` that the engine finds in ``request`` (a prompt or chat messages)."""
    return len(chunk_texts(rag, request, tenant))


def chunk_texts(rag: FusionRAG, request: Any, tenant: str | None = None) -> list[str]:
    """The registered texts of the chunks the engine finds in ``request``, in order."""
    with rag.engine.lock:  # the chunk catalog it reads may be growing on another thread
        return [segment.text for segment in rag.segments(for_tenant(request, tenant)) if segment.kind == "chunk"]


def _unfound_cause(rag: FusionRAG, context: str, request: Any, tenant: str | None) -> str:
    """Why some chunks of ``context`` are not found in ``request``: their text is not there as registered
    (REWRITTEN), or it is, and only its tokens differ at its edges (TOKEN_EDGES)."""
    missing = Counter(chunk_texts(rag, context, tenant)) - Counter(chunk_texts(rag, request, tenant))
    if isinstance(request, str):
        texts = [request]
    else:  # chat messages
        texts = [message.get("content") or "" for message in request if isinstance(message, dict)]
    held = all(any(chunk in text for text in texts) for chunk in missing)
    return TOKEN_EDGES if missing and held else REWRITTEN


def report(checked: CheckedRequest, warned: set[str], owner: str) -> None:
    """Log ``checked.cause`` once per ``owner`` (whose ``warned`` set remembers the causes said)."""
    cause = checked.cause
    if cause is None or cause in warned:
        return
    warned.add(cause)
    if cause == UNDONE:
        logger.info("%s: " + _MESSAGES[cause], owner)
    elif cause == UNREGISTERED:
        logger.warning("%s: " + _MESSAGES[cause], owner)
    else:
        logger.warning("%s: " + _MESSAGES[cause], owner, checked.unmatched, checked.expected)
