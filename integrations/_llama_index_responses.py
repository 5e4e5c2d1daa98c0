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


def chat_response(out, unmatched: int = 0, tools: Any = None) -> ChatResponse:
    """The answer as a chat response; ``tools`` (the request's ``tool_calls.ToolPlan``): its calls are read
    (``additional_kwargs["tool_calls"]``: ``{"id", "name", "arguments"}`` each), the rest is the content."""
    extra = extras(out.stats, out.token_ids, out.finish_reason, unmatched)
    if tools is None:
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=out.text), **extra)
    content, calls = tools.read(out.text)
    found = [{"id": call.id, "name": call.name, "arguments": call.arguments} for call in calls]
    message = ChatMessage(role=MessageRole.ASSISTANT, content=content, additional_kwargs={"tool_calls": found})
    return ChatResponse(message=message, **extra)


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


def chat_dicts(messages: Sequence[ChatMessage]) -> list[dict]:
    """LlamaIndex messages as a chat in OpenAI's shape (text only): an assistant's tool calls as
    ``tool_calls``, a tool's result as a ``tool`` message (``tool_calls.ToolPlan.chat`` renders them,
    ``tool_calls.in_words`` without tools)."""
    chat = []
    for index, message in enumerate(messages):
        if message.role not in _ROLES and message.role != MessageRole.TOOL:
            raise ValueError(f"messages[{index}] has role {message.role.value!r}; supported: system, user, assistant, "
                             "tool")  # fmt: skip
        if any(not isinstance(block, TextBlock) for block in message.blocks):
            raise ValueError(f"messages[{index}] holds non-text content; FusionRAGLLM takes text only")
        role, content = _ROLES.get(message.role, "user"), message.content or ""
        calls = message.additional_kwargs.get("tool_calls") or []
        if role == "assistant" and calls:
            chat.append({"role": role, "content": content, "tool_calls": [
                {"id": call.get("id") or f"call_{index}", "type": "function",
                 "function": {"name": call["name"], "arguments": call.get("arguments") or {}}} for call in calls]})  # fmt: skip
        elif message.role == MessageRole.TOOL:
            chat.append({"role": "tool", "content": content, "name": message.additional_kwargs.get("name"),
                         "tool_call_id": message.additional_kwargs.get("tool_call_id")})  # fmt: skip
        else:
            chat.append({"role": role, "content": content})
    return chat


def replace_in_chat(messages: list[dict[str, str]], old: str, new: str) -> list[dict[str, str]]:
    return [{**message, "content": message["content"].replace(old, new)} for message in messages]
