"""LlamaIndex responses from engine results (stats in ``additional_kwargs`` and ``raw``), and chats to engine messages."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Optional, Sequence

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, CompletionResponse, MessageRole, TextBlock

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
}


def completion(out, unmatched: int = 0) -> CompletionResponse:
    return CompletionResponse(text=out.text, **extras(out.stats, out.token_ids, out.finish_reason, unmatched))


def completion_delta(text: str, delta: str, extra: dict) -> CompletionResponse:
    return CompletionResponse(text=text, delta=delta, **extra)


def chat_response(out, unmatched: int = 0) -> ChatResponse:
    return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=out.text),
                        **extras(out.stats, out.token_ids, out.finish_reason, unmatched))  # fmt: skip


def chat_delta(text: str, delta: str, extra: dict) -> ChatResponse:
    return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta, **extra)


def extras(stats, token_ids, finish_reason: Optional[str] = None, unmatched: int = 0) -> dict:
    """``unmatched``: retrieved chunks the adapter found the prompt not to hold (``stats.unmatched_chunks``)."""
    stats = dataclasses.replace(stats, unmatched_chunks=unmatched).to_dict()
    raw = {"token_ids": list(token_ids), "stats": stats, "finish_reason": finish_reason}
    return {"additional_kwargs": {"fusionrag_stats": stats}, "raw": raw}


def deltas(stream, unmatched: int, make: Callable[[str, str, dict], Any]) -> Iterator[Any]:
    """Yield one response per text delta, then a last one with the final stats.

    The last delta is the text the stream held back and never yielded (an incomplete UTF-8 tail),
    usually empty, so that the deltas always add up to the final text.
    """
    text = ""
    try:
        for delta in stream:
            text += delta
            yield make(text, delta, extras(stream.stats, stream.token_ids, unmatched=unmatched))
    finally:  # a consumer that stops early takes the request out of the engine's batch
        stream.close()
    rest = stream.text[len(text) :] if stream.text.startswith(text) else ""
    yield make(text + rest, rest, extras(stream.stats, stream.token_ids, stream.finish_reason, unmatched))


def chat_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    """LlamaIndex messages as the engine's ``{"role", "content"}`` chat (text only)."""
    chat = []
    for index, message in enumerate(messages):
        if message.role not in _ROLES:
            raise ValueError(f"messages[{index}] has role {message.role.value!r}; supported: system, user, assistant")
        if any(not isinstance(block, TextBlock) for block in message.blocks):
            raise ValueError(f"messages[{index}] holds non-text content; FusionRAGLLM takes text only")
        chat.append({"role": _ROLES[message.role], "content": message.content or ""})
    return chat


def replace_in_chat(messages: list[dict[str, str]], old: str, new: str) -> list[dict[str, str]]:
    return [{**message, "content": message["content"].replace(old, new)} for message in messages]
