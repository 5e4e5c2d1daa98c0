"""Requests and their segmentation into prefix, chunks, text between, and suffix.

A prompt is the chat template's head, one user message, and the template's tail. The user message
is split into pieces: chunk texts and the text around them. Text before the first chunk joins the
prefix and text after the last chunk joins the suffix. Template text is tokenized with special
tokens parsed; everything the caller supplies is data (special-token text becomes ordinary
tokens), so no document or question can forge a chat turn.

A ``RAGRequest`` says where its chunks are: each piece is tokenized on its own, so a chunk has the
same ids as at ingestion. A flat prompt is tokenized as one piece and keeps those ids; registered
chunks are taken from it only where its own tokens equal theirs (``ChunkFinder.split_tokens``),
or all but the first word, which the prompt glued to the whitespace before it (``glued_ids``).
The two therefore agree wherever the tokenizer splits at the piece edges anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from fusionrag_llm.errors import FusionRAGError

SEGMENT_KINDS = ("prefix", "chunk", "text", "suffix")
DEFAULT_TENANT = ""  # one tenant for everything: the store keys and behaviour of a store without tenants
MAX_TENANT_CHARS = 128


def check_tenant(tenant) -> str:
    """``tenant`` as the engine keys it: ``None`` and ``""`` are the default tenant, anything else a
    name of 1-128 printable characters (no control characters, no line breaks).

    A tenant keeps to itself (docs/SECURITY.md#tenants): its registered chunks, their entries and fused
    neighbours, its exact and turn KV, and the reuse its requests report.

    >>> check_tenant(None), check_tenant("acme-eu")
    ('', 'acme-eu')
    """
    if tenant is None:
        return DEFAULT_TENANT
    if not isinstance(tenant, str) or len(tenant) > MAX_TENANT_CHARS or not tenant.isprintable():
        shown = f"a {type(tenant).__name__}" if not isinstance(tenant, str) else f"{tenant!r:.60}"
        raise FusionRAGError(f"a tenant must be None (the default tenant) or a string of at most {MAX_TENANT_CHARS} "
                             f"printable characters (no control characters or line breaks), got {shown}")  # fmt: skip
    return tenant


@dataclass(frozen=True)
class PromptFormat:
    """How a ``RAGRequest`` becomes the user message."""

    instruction: str = "Answer the question using the documents below. Reply with a short answer.\n\n"
    separator: str = "\n\n"
    question_prefix: str = "\n\nQuestion: "
    doc_label: str | None = None  # e.g. "[Doc_{n}] ": put before the n-th document (from 1), so a note can name it

    def __post_init__(self) -> None:
        for name in ("instruction", "separator", "question_prefix"):
            if not isinstance(getattr(self, name), str):
                raise FusionRAGError(f"PromptFormat.{name} must be a string, got {getattr(self, name)!r:.40}")
        if self.doc_label is not None:
            try:
                if not isinstance(self.doc_label, str):
                    raise TypeError
                self.doc_label.format(n=1)
            except (TypeError, ValueError, KeyError, IndexError, AttributeError):
                raise FusionRAGError(f"PromptFormat.doc_label must be a string whose only field is {{n}} (the "
                                     f"document's number), e.g. '[Doc_{{n}}] ', got {self.doc_label!r:.60}") from None


@dataclass(frozen=True)
class RAGRequest:
    """Retrieved chunks (in retrieval order) and a question; ``system`` replaces the default system prompt.

    >>> RAGRequest(chunks=["Paris is in France."], question="Where is Paris?").question
    'Where is Paris?'
    """

    chunks: Sequence[str]
    question: str
    system: str | None = None
    format: PromptFormat = field(default_factory=PromptFormat)
    note: str | None = None  # text between the documents and the question (e.g. an order hint)
    tenant: str | None = None  # whose chunks, entries and cached KV it may use (None: the default tenant)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tenant", check_tenant(self.tenant))
        if isinstance(self.chunks, (str, bytes)) or not hasattr(self.chunks, "__iter__"):
            raise FusionRAGError(f"RAGRequest.chunks must be a list of strings, got {type(self.chunks).__name__}")
        object.__setattr__(self, "chunks", tuple(self.chunks))
        for index, chunk in enumerate(self.chunks):
            if not isinstance(chunk, str) or not chunk.strip():
                raise FusionRAGError(f"RAGRequest.chunks[{index}] must be a non-empty string, got {chunk!r:.60}")
        if not isinstance(self.question, str) or not self.question.strip():
            raise FusionRAGError("RAGRequest.question must be a non-empty string")
        if self.system is not None and not isinstance(self.system, str):
            raise FusionRAGError("RAGRequest.system must be a string or None")
        if self.note is not None and not isinstance(self.note, str):
            raise FusionRAGError("RAGRequest.note must be a string or None")
        if not isinstance(self.format, PromptFormat):
            raise FusionRAGError(f"RAGRequest.format must be a PromptFormat, got {type(self.format).__name__}")

    def pieces(self) -> list[tuple[str, str]]:
        """The user message as (kind, text) pieces, kind 'chunk' or 'text'."""
        fmt = self.format
        pieces: list[tuple[str, str]] = [("text", fmt.instruction)]
        for index, chunk in enumerate(self.chunks):
            if index:
                pieces.append(("text", fmt.separator))
            if fmt.doc_label:
                pieces.append(("text", fmt.doc_label.format(n=index + 1)))
            pieces.append(("chunk", chunk))
        note = fmt.separator + self.note if self.note else ""
        pieces.append(("text", note + fmt.question_prefix + self.question))
        return pieces


@dataclass(frozen=True)
class TextPrompt:
    """A raw prompt: its text is all the model reads, with no chat template around it (the
    completions API). Registered chunks inside it are still found and reused.

    >>> TextPrompt("Paris is in France. Q: Where is Paris? A:").text[:5]
    'Paris'
    """

    text: str
    tenant: str | None = None  # whose chunks, entries and cached KV it may use (None: the default tenant)

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise FusionRAGError("a text prompt must be a non-empty string")
        object.__setattr__(self, "tenant", check_tenant(self.tenant))


@dataclass(frozen=True)
class ChatRequest:
    """A chat (``[{"role": ..., "content": ...}]``, the last message the user's) or a flat prompt string
    (one user message), answered for ``tenant``: what ``rag.generate`` takes bare, with a tenant.

    >>> ChatRequest([{"role": "user", "content": "Hi"}], tenant="acme").tenant
    'acme'
    """

    messages: str | Sequence[dict]
    tenant: str | None = None
    # a ``tool_calls.ToolPlan``: the tools offered (then messages may hold earlier calls and tool results)
    tools: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tenant", check_tenant(self.tenant))
        if self.tools is not None:
            from fusionrag_llm.tool_calls import ToolPlan

            if not isinstance(self.tools, ToolPlan) or not isinstance(self.messages, (list, tuple)):
                raise FusionRAGError("ChatRequest.tools must be a tool_calls.ToolPlan (ToolPlan.of(tools, tool_choice)), "
                                     "with a list of chat messages")  # fmt: skip
            object.__setattr__(self, "messages", tuple(validate_tool_messages(self.messages)))
        elif isinstance(self.messages, str):
            if not self.messages.strip():
                raise FusionRAGError("the prompt is empty; pass a non-empty string or a list of chat messages")
        elif isinstance(self.messages, (list, tuple)):
            object.__setattr__(self, "messages", tuple(validate_messages(self.messages)))
        else:
            raise FusionRAGError(f"ChatRequest.messages must be a prompt string or a list of chat messages, "
                                 f"got {type(self.messages).__name__}")  # fmt: skip


@dataclass(frozen=True)
class Segment:
    kind: str  # one of SEGMENT_KINDS
    text: str
    token_ids: tuple[int, ...]  # the prompt's own ids
    # a chunk whose first word the prompt glued to the whitespace before it (``ChunkFinder.split_tokens``):
    # its own first ids, which the text before holds inside one token; its stored KV serves the rest
    glued_ids: tuple[int, ...] = ()


def build_segments(body: Sequence[Segment], tail: Sequence[Segment] = ()) -> list[Segment]:
    """Segments of ``body + tail`` from pieces of kind 'chunk' or 'text' that carry their ids.

    Text before the first chunk joins the prefix; text after the last chunk joins the suffix with
    ``tail``; adjacent texts merge. Ids are only concatenated, never re-encoded, so the prompt's
    ids are exactly the pieces' ids in order (a text piece may hold template ids, special tokens
    included, next to data ids).
    """
    pieces = [piece for piece in body if piece.kind == "chunk" or piece.text or piece.token_ids]
    chunks = [index for index, piece in enumerate(pieces) if piece.kind == "chunk"]
    if not chunks:
        return [_join("prefix", pieces), _join("suffix", tail)]
    first, last = chunks[0], chunks[-1]
    segments = [_join("prefix", pieces[:first])]
    segments += _merge_adjacent_text(pieces[first : last + 1])
    segments.append(_join("suffix", [*pieces[last + 1 :], *tail]))
    return [segment for segment in segments if segment.token_ids or segment.kind != "text"]


def _join(kind: str, pieces: Sequence[Segment]) -> Segment:
    return Segment(kind, "".join(p.text for p in pieces), tuple(t for p in pieces for t in p.token_ids))


def _merge_adjacent_text(pieces: Sequence[Segment]) -> list[Segment]:
    merged: list[Segment] = []
    for piece in pieces:
        if piece.kind == "text" and merged and merged[-1].kind == "text":
            merged[-1] = _join("text", [merged[-1], piece])
        else:
            merged.append(piece)
    return merged


def split_segments(segments: Sequence[Segment], length: int) -> list[Segment]:
    """``segments`` with their first ``length`` tokens as one prefix segment (KV read from elsewhere,
    e.g. an earlier turn): a segment cut in two keeps its later part as text, or as the suffix if
    it was the suffix, so a chunk's ids are never taken for the chunk when only part of it is left."""
    head: list[int] = []
    rest: list[Segment] = []
    start = 0
    for segment in segments:
        end = start + len(segment.token_ids)
        if end <= length:
            head += segment.token_ids
        elif start >= length:
            rest.append(segment)
        else:
            cut = length - start
            head += segment.token_ids[:cut]
            kind = "suffix" if segment.kind == "suffix" else "text"
            rest.append(Segment(kind, "", tuple(segment.token_ids[cut:])))
        start = end
    return [Segment("prefix", "", tuple(head)), *rest]


def prompt_ids(segments: Sequence[Segment]) -> list[int]:
    return [token for segment in segments for token in segment.token_ids]


CHAT_ROLES = ("system", "user", "assistant")


def validate_messages(messages: Sequence[dict]) -> list[dict[str, str]]:
    """Chat messages as ``[{"role": ..., "content": ...}]``; the last one must be the user's."""
    if not messages:
        raise FusionRAGError("the chat has no messages; pass at least one user message")
    clean = []
    for index, message in enumerate(messages):
        role, content = (message.get("role"), message.get("content")) if isinstance(message, dict) else (None, None)
        if role not in CHAT_ROLES or not isinstance(content, str):
            raise FusionRAGError(
                f"messages[{index}] must be a dict with 'role' in {CHAT_ROLES} and a string 'content', got {message!r:.80}"
            )
        clean.append({"role": role, "content": content})
    if clean[-1]["role"] != "user" or not clean[-1]["content"].strip():
        raise FusionRAGError("the last chat message must be a non-empty user message")
    return clean


def validate_tool_messages(messages: Sequence[dict]) -> list[dict]:
    """A chat with tools, in OpenAI's shape: besides system, user and assistant messages, an assistant's
    ``tool_calls`` (``[{"id", "type": "function", "function": {"name", "arguments": {...}}}]``) and tool
    results (``{"role": "tool", "content", "name", "tool_call_id"}``); the last message is the user's or a
    tool result."""
    if not messages:
        raise FusionRAGError("the chat has no messages; pass at least one user message")
    clean = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        content = "" if content is None and role == "assistant" and message.get("tool_calls") else content
        if role not in (*CHAT_ROLES, "tool") or not isinstance(content, str):
            raise FusionRAGError(f"messages[{index}] must be a dict with 'role' in {(*CHAT_ROLES, 'tool')} and a string "
                                 f"'content', got {message!r:.80}")  # fmt: skip
        if role == "tool":
            name, call_id = message.get("name"), message.get("tool_call_id")
            if not all(value is None or isinstance(value, str) for value in (name, call_id)):
                raise FusionRAGError(f"messages[{index}]: a tool message's name and tool_call_id must be strings")
            clean.append({"role": role, "content": content, "name": name, "tool_call_id": call_id})
        elif role == "assistant" and message.get("tool_calls"):
            clean.append({"role": role, "content": content, "tool_calls": [_checked_call(call, index)
                                                                            for call in message["tool_calls"]]})  # fmt: skip
        else:
            clean.append({"role": role, "content": content})
    if clean[-1]["role"] not in ("user", "tool") or (clean[-1]["role"] == "user" and not clean[-1]["content"].strip()):
        raise FusionRAGError("the last chat message must be a non-empty user message or a tool result")
    return clean


def _checked_call(call: Any, index: int) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(function, dict) and isinstance(function.get("name"), str) and isinstance(function.get("arguments"), dict)
            and isinstance(call.get("id", ""), str)):  # fmt: skip
        raise FusionRAGError(f"messages[{index}].tool_calls must be [{{'id': str, 'type': 'function', 'function': "
                             "{'name': str, 'arguments': {...}}}]")  # fmt: skip
    return {"id": call.get("id") or f"call_{index}", "type": "function",
            "function": {"name": function["name"], "arguments": function["arguments"]}}  # fmt: skip
