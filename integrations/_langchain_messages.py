"""LangChain messages to the engine's chat and back: roles and text content, chunks with usage, stop strings in streams."""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence

from langchain_core.messages import (AIMessage, AIMessageChunk, BaseMessage, ChatMessage, HumanMessage, SystemMessage,
                                     ToolMessage)  # fmt: skip
from langchain_core.outputs import ChatGenerationChunk



def chat_chunk(delta: str, info: Optional[dict]) -> ChatGenerationChunk:
    if info is None:
        return ChatGenerationChunk(message=AIMessageChunk(content=delta))
    # usage once, on the last chunk, so that summing chunks counts it once
    last = AIMessageChunk(content="", response_metadata=info, usage_metadata=usage(info), chunk_position="last")
    return ChatGenerationChunk(message=last, generation_info=info)


def warn_tools(tools: Optional[Sequence[Any]]) -> None:
    if tools is not None:
        warnings.warn("FusionRAG models take no tools; their schemas are not counted", stacklevel=3)


def usage(info: dict) -> dict:
    """LangChain's usage: ``input_token_details.cache_read`` counts the prompt tokens whose KV was
    read rather than computed or recomputed (the exact prefix and turn caches, reused chunk KV)."""
    stats = info["fusionrag_stats"]
    prompt, generated = stats["prompt_tokens"], stats["generated_tokens"]
    cached = stats["exact_tokens"] + stats["reused_tokens"]
    return {"input_tokens": prompt, "output_tokens": generated, "total_tokens": prompt + generated,
            "input_token_details": {"cache_read": cached}}  # fmt: skip


def chat_dicts(messages: Sequence[BaseMessage]) -> list[dict]:
    """``messages`` as a chat in OpenAI's shape: an AI message's tool calls as ``tool_calls``, a tool's result
    as a ``tool`` message (``tool_calls.ToolPlan.chat`` renders them; ``tool_calls.in_words`` without tools)."""
    chat = []
    for index, message in enumerate(messages):
        content = _text(message.content, index)
        if isinstance(message, SystemMessage):
            role = "system"
        elif isinstance(message, HumanMessage):
            role = "user"
        elif isinstance(message, AIMessage):
            role = "assistant"
            if message.tool_calls:
                chat.append({"role": role, "content": content, "tool_calls": [
                    {"id": call.get("id") or f"call_{index}", "type": "function",
                     "function": {"name": call["name"], "arguments": call["args"]}} for call in message.tool_calls]})  # fmt: skip
                continue
        elif isinstance(message, ToolMessage):
            chat.append({"role": "tool", "content": content, "name": message.name, "tool_call_id": message.tool_call_id})
            continue
        elif isinstance(message, ChatMessage) and message.role in ("system", "user", "assistant"):
            role = message.role
        else:
            raise ValueError(f"messages[{index}] is a {type(message).__name__}; supported: system, human, ai and tool "
                             "messages")  # fmt: skip
        chat.append({"role": role, "content": content})
    return chat


def _text(content, index: int) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(block["text"])
        else:
            raise ValueError(f"messages[{index}] holds non-text content; FusionRAG models take text only")
    return "".join(parts)
