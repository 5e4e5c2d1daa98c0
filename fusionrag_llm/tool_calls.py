"""Tool calling. For models whose chat template has no tool format (the default SmolLM2 among them): a
generic tool prompt, and the answer constrained to JSON that is a call of one of the tools (or, with
``tool_choice="auto"``, a plain answer), so even a small model emits well-formed calls.

Tools come in OpenAI's shape (``{"type": "function", "function": {"name", "description",
"parameters"}}``). The system message gains a list of the tools and how to call one; decoding is
constrained (``SamplingParams.json_schema``) to ``{"name": <a tool>, "arguments": <its parameters>}``,
or ``{"answer": "..."}`` when the model may answer instead. A tool's result goes back to the model as a
user message that names the tool.

For a template with a tool format of its own (Qwen2.5's ``<tool_call>`` JSON, Llama 3.1's JSON with
``"parameters"``, ...), the tools, earlier calls and results go through the template as the model was
trained on them: the format is read from how the template renders a probe call (``infer_tool_format``),
a forced call starts after its prefix, constrained to the tools' schemas, and calls are read back in it.
``ToolPlan`` picks the way for a request. Used by the server (``tools``, ``tool_choice``), the LangChain
chat model (``bind_tools``) and LlamaIndex's function calling.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Callable

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


# ---------------------------------------------------------------------- the chat template's own tool format
PROBE_TOOL = "fusionrag_probe_tool"
_PROBE_ARGUMENTS = {"probe_argument": 7}


@dataclass(frozen=True)
class ToolFormat:
    """How a chat template writes a call into an assistant turn, as the model was trained to write it:
    the text before the call's JSON object (e.g. ``"<tool_call>\\n"``), the keys of its name and its
    arguments in that object, and the text after it up to the end of the turn."""

    prefix: str
    name_key: str
    arguments_key: str
    suffix: str


def infer_tool_format(render: Callable[[list[dict], list[dict], bool], str]) -> ToolFormat | None:
    """The tool format of the template behind ``render(messages, tools, add_generation_prompt) -> text``,
    read from how it renders a probe call; None when it lists no tools or writes no call as a JSON
    object with the tool's name and its arguments as an object (then the generic tool prompt is used).
    """
    tools = [{"type": "function", "function": {"name": PROBE_TOOL, "description": "A probe.", "parameters": {
        "type": "object", "properties": {"probe_argument": {"type": "integer"}}}}}]  # fmt: skip
    user = {"role": "user", "content": "fusionrag probe question"}
    call = {"id": "call_probe", "type": "function", "function": {"name": PROBE_TOOL, "arguments": _PROBE_ARGUMENTS}}
    try:
        head = render([user], tools, True)
        answered = render([user, {"role": "assistant", "content": "fusionrag probe answer"}], tools, False)
        called = render([user, {"role": "assistant", "content": "", "tool_calls": [call]}], tools, False)
    except Exception:  # a template that takes no tools, or not in this shape
        return None
    if PROBE_TOOL not in head or not answered.startswith(head) or not called.startswith(head):
        return None
    end = answered[len(head) :].partition("fusionrag probe answer")[2]  # what closes an assistant turn
    turn = called[len(head) :]
    body = turn[: len(turn) - len(end)] if end and turn.endswith(end) else turn
    decoder = json.JSONDecoder()
    for start in (i for i, char in enumerate(body) if char == "{"):
        try:
            value, stop = decoder.raw_decode(body, start)
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        names = [key for key, item in value.items() if item == PROBE_TOOL]
        arguments = [key for key, item in value.items() if item == _PROBE_ARGUMENTS]
        if len(value) == 2 and names and arguments:
            return ToolFormat(body[:start], names[0], arguments[0], body[stop:])
    return None


def call_schema(tools: list[Tool], choice: str, fmt: ToolFormat) -> dict | None:
    """The JSON object of one call in the template's format, constrained to the tools' schemas (``required``
    or a named tool); None for ``auto`` and ``none`` (the model may answer in words: nothing to constrain)."""
    if choice in ("auto", "none"):
        return None
    chosen = [tool for tool in tools if choice == "required" or tool.name == choice]
    options = [{"type": "object", "additionalProperties": False, "required": [fmt.name_key, fmt.arguments_key],
                "properties": {fmt.name_key: {"const": tool.name}, fmt.arguments_key: tool.parameters}}
               for tool in chosen]  # fmt: skip
    return options[0] if len(options) == 1 else {"anyOf": options}


def read_calls(text: str, fmt: ToolFormat, tools: list[Tool], started: bool = False) -> tuple[str, list[ToolCall]]:
    """``(content, calls)`` from an answer in the template's tool format: every call the answer writes (its
    prefix, then a JSON object naming one of ``tools`` with an arguments object); ``started``: the answer
    began after the prefix (it was given in the prompt). Text that holds no such call stays content."""
    known, decoder, calls = {tool.name for tool in tools}, json.JSONDecoder(), []
    rest = (fmt.prefix + text) if started else text
    content = rest
    while True:
        at = rest.find(fmt.prefix) if fmt.prefix else rest.find("{")
        if at < 0:
            break
        start = at + len(fmt.prefix)
        while start < len(rest) and rest[start].isspace():
            start += 1
        try:
            value, stop = decoder.raw_decode(rest, start)
        except ValueError:
            break
        if not (isinstance(value, dict) and value.get(fmt.name_key) in known and isinstance(value.get(fmt.arguments_key), dict)):
            break
        if not calls:
            content = rest[:at]
        calls.append(ToolCall(f"call_{uuid.uuid4().hex[:24]}", value[fmt.name_key], value[fmt.arguments_key]))
        rest = rest[stop:]
        rest = rest[len(fmt.suffix) :] if fmt.suffix and rest.startswith(fmt.suffix) else rest
    return (content.strip() if calls else text), calls


@dataclass(frozen=True)
class ToolPlan:
    """A request's ``tools`` and ``tool_choice`` as the engine runs them: in the chat template's own tool
    format where it has one (``fmt``, from ``Tokenizer.tool_format``: the template lists the tools and
    renders earlier calls and results, a forced call starts after the format's prefix and is constrained
    to the tools' schemas), else the generic tool prompt of this module.

    Messages come in OpenAI's shape: an assistant message may hold ``tool_calls`` (``[{"id", "type":
    "function", "function": {"name", "arguments": {...}}}]``) and a ``{"role": "tool", "content", "name"
    or "tool_call_id"}`` message carries a result; ``chat`` turns them into what the template renders.
    """

    tools: tuple[Tool, ...]
    definitions: tuple[dict, ...]  # the tools as OpenAI tool dicts, for a template that lists them
    choice: str
    fmt: ToolFormat | None = None

    @classmethod
    def of(cls, tools: Any, choice: Any, fmt: ToolFormat | None = None) -> "ToolPlan":
        checked = check_tools(tools)
        definitions = tuple({"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                               "parameters": tool.parameters}} for tool in checked)  # fmt: skip
        return cls(tuple(checked), definitions, check_choice(choice, checked), fmt)

    @property
    def schema(self) -> dict | None:
        """The JSON schema the answer (after ``answer_prefix``) is constrained to; None: free text."""
        if self.fmt is not None:
            return call_schema(list(self.tools), self.choice, self.fmt)
        return answer_schema(list(self.tools), self.choice)

    @property
    def answer_prefix(self) -> str:
        """Template text the answer starts from: the format's call prefix when a call is forced."""
        return self.fmt.prefix if self.fmt is not None and self.schema is not None else ""

    def chat(self, messages: list[dict]) -> list[dict]:
        """``messages`` as the engine renders them: kept in OpenAI's shape (tool names filled in) for the
        template's own format; for the generic prompt, calls and results in words and the tools listed in
        the system message."""
        if self.fmt is not None:
            return _named(messages)
        return with_tools_text(in_words(messages), tools_prompt(list(self.tools), self.choice))

    def read(self, text: str) -> tuple[str, list[ToolCall]]:
        """``(content, calls)`` of an answer to this request."""
        if self.choice == "none":
            return text, []
        if self.fmt is not None:
            return read_calls(text, self.fmt, list(self.tools), started=bool(self.answer_prefix))
        return read_answer(text)


def in_words(messages: list[dict]) -> list[dict]:
    """OpenAI-shaped ``messages`` as a plain chat: earlier calls and their results in words (``call_text``,
    ``result_text``), for a template without tools or a request without them."""
    chat = []
    for message in _named(messages):
        if message["role"] == "tool":
            chat.append({"role": "user", "content": result_text(message["name"], message["content"])})
        elif message.get("tool_calls"):
            said = [call_text(call["function"]["name"], call["function"]["arguments"]) for call in message["tool_calls"]]
            chat.append({"role": "assistant", "content": "\n".join(said)})
        else:
            chat.append({"role": message["role"], "content": message["content"]})
    return chat


def _named(messages: list[dict]) -> list[dict]:
    """``messages`` with each tool result's ``name`` filled in from the call it answers, where it has none."""
    names: dict[Any, str] = {}
    named = []
    for message in messages:
        names.update((call.get("id"), call["function"]["name"]) for call in message.get("tool_calls") or [])
        if message["role"] == "tool" and not message.get("name"):
            message = {**message, "name": names.get(message.get("tool_call_id"))}
        named.append(message)
    return named
