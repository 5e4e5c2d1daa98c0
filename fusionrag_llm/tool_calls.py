"""Tool calling for models whose chat template has no tool format (the default SmolLM2 among them): a
generic tool prompt, and the answer constrained to JSON that is a call of one of the tools (or, with
``tool_choice="auto"``, a plain answer), so even a small model emits well-formed calls.

Tools come in OpenAI's shape (``{"type": "function", "function": {"name", "description",
"parameters"}}``). The system message gains a list of the tools and how to call one; decoding is
constrained (``SamplingParams.json_schema``) to ``{"name": <a tool>, "arguments": <its parameters>}``,
or ``{"answer": "..."}`` when the model may answer instead. A tool's result goes back to the model as a
user message that names the tool. Used by the server (``tools``, ``tool_choice``) and the LangChain chat
model (``bind_tools``).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from fusionrag_llm.errors import FusionRAGError

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict


def check_tools(tools: Any) -> list[Tool]:
    """OpenAI-shaped tool definitions as ``Tool``s; a bad one is a ``FusionRAGError`` saying what is wrong."""
    if not isinstance(tools, (list, tuple)) or not tools or len(tools) > MAX_TOOLS:
        raise FusionRAGError(f"tools must be a list of 1 to {MAX_TOOLS} tool definitions")
    checked = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not _NAME.match(function["name"]):
            raise FusionRAGError(f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': "
                                 "...}}}} with a name of 1-64 letters, digits, '_' or '-'")  # fmt: skip
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise FusionRAGError(f"tools[{index}].function.parameters must be a JSON schema object")
        checked.append(Tool(function["name"], str(function.get("description") or ""), parameters))
    names = [tool.name for tool in checked]
    if len(set(names)) != len(names):
        raise FusionRAGError(f"tool names must be unique, got {names}")
    return checked


def check_choice(choice: Any, tools: list[Tool]) -> str:
    """``tool_choice`` as ``none``, ``auto``, ``required`` or one tool's name (OpenAI's forms; None: auto)."""
    if choice is None:
        return "auto"
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        choice = name if isinstance(name, str) else choice
    if choice == "any":  # LangChain's word for required
        choice = "required"
    if choice in CHOICES or (isinstance(choice, str) and choice in {tool.name for tool in tools}):
        return choice
    raise FusionRAGError(f"tool_choice must be one of {', '.join(CHOICES)}, a tool's name or "
                         f"{{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r:.80}")  # fmt: skip


def tools_prompt(tools: list[Tool], choice: str) -> str:
    """What the system message says of the tools (for ``none``: to answer in words)."""
    if choice == "none":
        return "Answer the user's question now in one plain sentence that states the tool's result; do not call a tool."
    listed = "\n".join(f"- {tool.name}: {tool.description} Parameters: {json.dumps(tool.parameters)}" for tool in tools)
    how = 'To call a tool, answer with JSON only: {"name": "<tool name>", "arguments": {<its parameters>}}.'
    if choice == "auto":
        how += (" Call a tool whenever one of them can give or check the answer; only when none can, answer "
                '{"answer": "<your answer>"}.')
    elif choice != "required":
        how += f" Call {choice}."
    return f"You can call these tools:\n{listed}\n{how}"


def answer_schema(tools: list[Tool], choice: str) -> dict | None:
    """The JSON schema the answer is constrained to (None: free text, for ``none``)."""
    if choice == "none":
        return None
    chosen = [tool for tool in tools if choice in ("auto", "required") or tool.name == choice]
    options = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                "properties": {"name": {"const": tool.name}, "arguments": tool.parameters}} for tool in chosen]  # fmt: skip
    if choice == "auto":
        options.append({"type": "object", "additionalProperties": False, "required": ["answer"],
                        "properties": {"answer": {"type": "string"}}})  # fmt: skip
    return options[0] if len(options) == 1 else {"anyOf": options}


def read_answer(text: str) -> tuple[str, list[ToolCall]]:
    """``(content, calls)`` from a constrained answer: a call, or ``{"answer": ...}`` as content; text that
    is no complete JSON (cut by the token limit) stays content, with no call."""
    try:
        value = json.loads(text)
    except ValueError:
        return text, []
    if isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(value.get("arguments"), dict):
        return "", [ToolCall(f"call_{uuid.uuid4().hex[:24]}", value["name"], value["arguments"])]
    if isinstance(value, dict) and isinstance(value.get("answer"), str):
        return value["answer"], []
    return text, []


def call_text(name: str, arguments: dict) -> str:
    """An earlier call, as an assistant turn of the chat (in words: a small model would otherwise copy the
    JSON into an answer that must be words)."""
    return f"I call the tool {name} with {json.dumps(arguments)}."


def result_text(name: str | None, content: str) -> str:
    """A tool's result as the user message that hands it back to the model."""
    return f"The tool {name} returned: {content}" if name else f"The tool returned: {content}"


def with_tools_text(chat: list[dict[str, str]], text: str) -> list[dict[str, str]]:
    """``chat`` with ``text`` (``tools_prompt``) joined to its system message, or put first as one."""
    if not text:
        return chat
    if chat and chat[0]["role"] == "system":
        return [{"role": "system", "content": f"{chat[0]['content']}\n\n{text}"}, *chat[1:]]
    return [{"role": "system", "content": text}, *chat]


def tool_request(tools: Any, choice: Any) -> tuple[str, dict | None]:
    """``(what the system message gains, the answer's JSON schema)`` for a request's ``tools`` and
    ``tool_choice``, both checked (the schema is None under ``none``: free text)."""
    checked = check_tools(tools)
    choice = check_choice(choice, checked)
    return tools_prompt(checked, choice), answer_schema(checked, choice)
