"""The OpenAI-compatible request and response shapes, and their translation to engine calls.

Requests are pydantic models: types are checked by pydantic, ranges by the engine's own validators
(``SamplingParams``, the methods' ``make_plan``), so the server and the library refuse the same values with
the same words. Fields of the OpenAI API this engine cannot honour (tools, logprobs, JSON mode) are
refused with a 400 that says so; unknown fields are ignored, as OpenAI-compatible servers do.
FusionRAG's own options travel as extra body fields (``method``, ``recompute_ratio``, ``method_options``,
``tenant`` or vLLM's ``cache_salt``: read by ``server/tenants.py``),
as do vLLM's sampling extras (``top_k``, ``min_p``,
``repetition_penalty``, ``stop_token_ids``, ``ignore_eos``).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from fusionrag_llm.engine.llm_engine import MAX_N, check_stop
from fusionrag_llm.engine.sampling import SAMPLING_FIELDS, SamplingParams
import fusionrag_llm.tool_calls as tool_calls
from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.methods import get_method, make_plan
from fusionrag_llm.request import ChatRequest, TextPrompt
from fusionrag_llm.server.engine_loop import Prepared

class Unsupported(FusionRAGError):
    """A field of the OpenAI API that this server cannot honour."""


class _Tenant(BaseModel):
    """The tenant a request names (``server/tenants.py`` decides whose it is served for)."""

    tenant: Optional[str] = None
    cache_salt: Optional[str] = None  # vLLM's name for it


class _Options(_Tenant):
    """What chat and text completions share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: Optional[int] = Field(default=None, ge=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: Optional[dict[str, Any]] = None
    stop: Optional[Union[str, list[str]]] = None
    temperature: Optional[float] = None  # None: greedy (the engine's default)
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    seed: Optional[int] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    logprobs: Optional[Union[bool, int]] = None
    top_logprobs: Optional[int] = None
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None
    # FusionRAG's own: the method, its ratio (None: the method's own) and its options (e.g. A3's decode_kv_budget)
    method: str = "fusionrag"
    recompute_ratio: Optional[float] = None
    reproducible: Optional[bool] = None  # True: never reads exact or turn KV earlier requests left
    method_options: Optional[dict[str, Any]] = None
    response_format: Optional[dict[str, Any]] = None  # text, json_object or json_schema (OpenAI's shape)

    def prepared(self, request: Any) -> Prepared:
        """The engine call this asks for (``request``: for the tenant decided already); bad values raise
        ``FusionRAGError`` (a 400)."""
        if self.logprobs or self.top_logprobs:
            raise Unsupported("logprobs are not supported by this server")
        if self.logit_bias:
            raise Unsupported("logit_bias is not supported by this server")
        plan = make_plan(get_method(self.method, **(self.method_options or {})), self.recompute_ratio, self.reproducible)
        given = {name: getattr(self, name, None) for name in SAMPLING_FIELDS if getattr(self, name, None) is not None}
        sampling = SamplingParams(**given, json_schema=_json_schema(self.response_format))
        return Prepared(request, plan, self.max_completion_tokens or self.max_tokens, check_stop(self.stop),
                        sampling, self.n)  # fmt: skip

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


def _json_schema(response_format: dict[str, Any] | None) -> Any:
    """OpenAI's ``response_format`` as ``SamplingParams.json_schema``: ``text`` (or none) None,
    ``json_object`` True (any JSON object), ``json_schema`` its ``json_schema.schema``."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return True
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise FusionRAGError("response_format of type json_schema needs json_schema.schema, a JSON schema object")
        return spec["schema"]
    raise Unsupported(f"response_format type {kind!r} is not supported; allowed: text, json_object, json_schema")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: Optional[str] = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Optional[Union[str, list[ContentPart]]] = None
    tool_calls: Optional[list[dict[str, Any]]] = None  # an assistant's earlier calls
    tool_call_id: Optional[str] = None  # a tool message: the call it answers
    name: Optional[str] = None


class ChatCompletionRequest(_Options):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Any] = None

    def prepared(self, tenant: str = "", tool_format: Any = None) -> Prepared:  # type: ignore[override]
        """``tool_format``: the chat template's own (``Tokenizer.tool_format``), None for the generic prompt."""
        messages = _chat_dicts(self.messages)
        if not self.tools:
            return super().prepared(ChatRequest(tool_calls.in_words(messages), tenant=tenant))
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise FusionRAGError("give tools or a JSON response_format, not both")
        tools = tool_calls.ToolPlan.of(self.tools, self.tool_choice, tool_format)
        prepared = super().prepared(ChatRequest(messages, tenant=tenant, tools=tools))
        sampling = replace(prepared.sampling, json_schema=tools.schema)
        return replace(prepared, sampling=sampling, tools=tools if tools.choice != "none" else None)


class CompletionRequest(_Options):
    prompt: Union[str, list[str]]
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    def prepared(self, tenant: str = "", tool_format: Any = None) -> Prepared:  # type: ignore[override]
        if self.echo or self.suffix:
            raise Unsupported("echo and suffix are not supported by this server")
        if self.best_of not in (None, self.n):
            raise Unsupported("best_of must equal n (or be left out): answers are not ranked")
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise Unsupported("send one prompt per request (a list of exactly one string); use concurrent "
                                  "requests for several, which the server batches")  # fmt: skip
            prompt = prompt[0]
        return super().prepared(TextPrompt(prompt, tenant=tenant))


class ChunksRequest(_Tenant):
    """``POST /v1/chunks``: register texts (plain and fused KV computed now) for later requests of the same
    tenant to reuse."""

    model_config = ConfigDict(extra="forbid")

    texts: list[str] = Field(min_length=1, max_length=1000)
    fuse: bool = True
    neighbors: int = Field(default=10, ge=0, le=64)


def _chat_dicts(messages: list[ChatMessage]) -> list[dict]:
    """The chat in OpenAI's shape, text only: an assistant's earlier calls with their arguments as objects,
    a tool's result as a ``tool`` message (``tool_calls.ToolPlan.chat`` renders them)."""
    chat = []
    for index, message in enumerate(messages):
        role = "system" if message.role == "developer" else message.role
        content = message.content
        if isinstance(content, list):
            if any(part.type != "text" or part.text is None for part in content):
                raise Unsupported(f"messages[{index}]: only text content parts are supported")
            content = "".join(part.text for part in content)
        content = content or ""
        if role == "assistant" and message.tool_calls:
            calls = []
            for call in message.tool_calls:
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise FusionRAGError(f"messages[{index}].tool_calls holds a call without function.name")
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    raise FusionRAGError(f"messages[{index}].tool_calls: arguments must be a JSON object's text") from None
                if not isinstance(arguments, dict):
                    raise FusionRAGError(f"messages[{index}].tool_calls: arguments must be a JSON object's text")
                calls.append({"id": str(call.get("id") or f"call_{len(calls)}"), "type": "function",
                              "function": {"name": function["name"], "arguments": arguments}})  # fmt: skip
            chat.append({"role": "assistant", "content": content, "tool_calls": calls})
        elif role in ("tool", "function"):
            chat.append({"role": "tool", "content": content, "name": message.name, "tool_call_id": message.tool_call_id})
        else:
            chat.append({"role": role, "content": content})
    return chat


# ---------------------------------------------------------------------- responses
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(stats: list[Any]) -> dict[str, Any]:
    """OpenAI usage over a request's answers; ``cached_tokens``: prompt tokens whose KV was reused."""
    first = stats[0]
    completion = sum(one.generated_tokens for one in stats)
    cached = first.exact_tokens + first.reused_tokens
    return {"prompt_tokens": first.prompt_tokens, "completion_tokens": completion,
            "total_tokens": first.prompt_tokens + completion, "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


def fusionrag_extra(body: _Options, stats: list[Any]) -> dict[str, Any]:
    return {"method": body.method, "recompute_ratio": body.recompute_ratio, "stats": [one.to_dict() for one in stats]}


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:  # fmt: skip
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def created() -> int:
    return int(time.time())
