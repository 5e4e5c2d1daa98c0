"""LlamaIndex adapters: ``FusionRAGLLM`` (a ``FunctionCallingLLM``), ``FusionRAGIngestion`` (a ``TransformComponent``),
``FusionRAGEmbedding`` (a ``BaseEmbedding``) and ``FusionRAGRetriever`` (a ``BaseRetriever`` over the
document index of ``fusionrag ingest``).

A stock query engine works unchanged: the ingestion component registers every node as the text the
response synthesizer will put in the prompt (``node.get_content(metadata_mode=MetadataMode.LLM)``),
and the engine finds those texts in the formatted prompt by content and serves them from their
fused KV entries.

    rag = FusionRAG.from_pretrained("smollm2-135m")
    embed_model = FusionRAGEmbedding()
    nodes = IngestionPipeline(transformations=[SentenceSplitter(), embed_model,
                                               FusionRAGIngestion(rag=rag)]).run(documents=docs)
    index = VectorStoreIndex(nodes, embed_model=embed_model)
    answer = index.as_query_engine(llm=FusionRAGLLM(rag=rag)).query("Who built the lighthouse?")

Per-call stats travel in ``CompletionResponse.additional_kwargs["fusionrag_stats"]`` (and ``raw``),
so a ``CallbackManager`` handler (e.g. ``LlamaDebugHandler``) sees them for every LLM call.
The async methods (``acomplete``, ``achat``, ``astream_complete``, ``astream_chat``) run the engine on
worker threads, whose concurrent requests it batches, so they never block the event loop; async
streams yield deltas as tokens are decoded. Retrieved texts must fit the prompt as they are: when they
exceed ``context_window - num_output`` LlamaIndex re-splits them and the pieces are computed, not reused.

``metadata.is_chat_model`` is True when the model has a chat template, so chat engines
(``context``, ``condense_plus_context``, ``condense_question``) and query engines send chats; chunk
texts are found in any message. Where a template is formatted with retrieved context
(``context_str``), the prompt is checked to hold the registered chunks: a context formatted as a
Python list (``response_mode="simple_summarize"``) is put back as text, and chunks still not found
are counted in ``fusionrag_stats["unmatched_chunks"]`` and logged once per cause.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
from typing import Any, Callable, Optional, Sequence

from fusionrag_llm.errors import require

require("llama_index.core", "llama-index", "fusionrag_llm.integrations.llama_index")  # a clear hint, not a bare ImportError

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.types import PydanticProgramMode
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from fusionrag_llm import FusionRAG, tool_calls
from fusionrag_llm.integrations import _retrieved, _shared
from fusionrag_llm.integrations._llama_index_ingestion import FusionRAGIngestion
from fusionrag_llm.integrations._llama_index_retrieval import FusionRAGEmbedding, FusionRAGRetriever
from fusionrag_llm.integrations._llama_index_responses import (
    chat_delta,
    chat_dicts,
    chat_response,
    completion,
    completion_delta,
    deltas,
    replace_in_chat,
)

__all__ = ["FusionRAGEmbedding", "FusionRAGIngestion", "FusionRAGLLM", "FusionRAGRetriever"]

# The prompt arguments LlamaIndex's synthesizers put retrieved node texts in (QA and refine templates).
_CONTEXT_ARGUMENTS = ("context_str", "context_msg")
# (request, unmatched chunks) from the prompt formatted last in this context, for the call that sends it.
_CHECKED: contextvars.ContextVar[Optional[tuple[Any, int]]] = contextvars.ContextVar("fusionrag_checked", default=None)


# What llama-index-llms-openai / -llama-cpp users write for a field here.
_SPELLINGS = {"max_tokens": "max_new_tokens", "model_path": "model_name", "model": "model_name"}
# generate_kwargs keys: the per-call options (sampling included) and stop strings; additional_kwargs keys:
# the sampling options and their seed. Both also take repeat_penalty for repetition_penalty.
_GENERATE_KWARGS = (*_shared.CALL_OPTIONS, "stop")
_ADDITIONAL_KWARGS = (*_shared.SAMPLING_OPTIONS, "seed")
_LOAD_SETTINGS = ("store", "device", "dtype")


class FusionRAGLLM(FunctionCallingLLM):
    """A LlamaIndex LLM answering with a ``FusionRAG`` engine (greedy unless ``temperature`` > 0).

    Give ``rag`` (an engine) or ``model_name`` (loaded on first use with ``store``, ``device`` and
    ``dtype``, and shared by every adapter given the same ones). ``complete(prompt, stop=[...],
    method=..., recompute_ratio=..., max_new_tokens=...)`` overrides the settings for one call;
    ``generate_kwargs`` holds defaults for every call. ``temperature`` > 0 samples; ``additional_kwargs``
    holds the other sampling options (``top_p``, ``top_k``, ``min_p``, the repetition / frequency /
    presence penalties, ``seed``), and ``generate_kwargs`` and
    each call take them too; ``do_sample=False`` decodes greedily whatever the temperature.
    ``system_prompt`` is sent as the chat's system message by ``complete(prompt)``. ``tenant``: answer for
    that tenant (its registered chunks and cached KV only; register with ``FusionRAGIngestion(tenant=...)``).

    >>> llm = FusionRAGLLM(model_name="tiny", store=":memory:", max_tokens=8, context_window=2048)
    >>> llm.metadata.context_window, llm.metadata.num_output
    (2048, 8)
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=(), extra="forbid")

    rag: Optional[Any] = Field(default=None, exclude=True, description="A FusionRAG engine; None: load model_name.")
    model_name: str = Field(default=_shared.DEFAULT_MODEL_NAME, description="Model to load when rag is None.")
    method: str = Field(default="fusionrag", description="One of fusionrag_llm.method_names().")
    recompute_ratio: Optional[float] = Field(default=None, description="Share of reused chunk tokens recomputed, in "
                                             "[0, 1]; None: the method's own.")
    method_options: Optional[dict[str, Any]] = Field(default=None, description="The method's own options, e.g. "
                                                     "{'decode_kv_budget': 128} for a3.")
    max_new_tokens: int = Field(default=32, description="Most tokens generated per call (alias max_tokens).")
    temperature: Optional[float] = Field(default=0.0, strict=True, description="0 or None: greedy; > 0 samples.")
    additional_kwargs: dict[str, Any] = Field(
        default_factory=dict, description=f"Sampling options for every call: {', '.join(_ADDITIONAL_KWARGS)}."
    )
    context_window: Optional[int] = Field(default=None, description="Report a smaller window than the model's.")
    generate_kwargs: dict[str, Any] = Field(default_factory=dict, description="Per-call options for every call.")
    is_chat_model: Optional[bool] = Field(
        default=None, description="None: True when the model has a chat template; False: LlamaIndex sends completions."
    )
    store: Optional[Any] = Field(default=None, exclude=True, description="KV store when loading model_name.")
    device: Optional[Any] = Field(default=None, description="Device when loading model_name.")
    dtype: Optional[Any] = Field(default=None, description="Dtype when loading model_name.")
    tenant: Optional[str] = Field(default=None, description="Answer for this tenant only; None: the default one.")
    # structured_predict runs LlamaIndex's text program, its calls constrained to the output class's
    # schema (a function-calling program would leave the choice of calling to the model)
    pydantic_program_mode: PydanticProgramMode = PydanticProgramMode.LLM

    _warned: set = PrivateAttr(default_factory=set)  # causes of unreused retrieved chunks already logged

    @model_validator(mode="before")
    @classmethod
    def _map_spellings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return _shared.map_arguments(cls.__name__, data, cls.model_fields, _SPELLINGS)

    @model_validator(mode="after")
    def _check_settings(self) -> "FusionRAGLLM":
        _shared.check_rag(self.rag)
        self.tenant = _shared.checked_tenant(self.tenant)
        self._check_kwargs()
        self._options({})  # the engine's own checks of every setting, sampling included
        _check_context_window(self.context_window)
        if self.rag is not None:
            given = [name for name in _LOAD_SETTINGS if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: only used when the adapter loads model_name; the engine "
                                 "given as rag= is already loaded (pass them to FusionRAG.from_pretrained)")  # fmt: skip
            self.model_name = self.rag.model_name
            _check_context_window(self.context_window, self.rag)
        return self

    def _check_kwargs(self) -> None:
        """Known keys only, and each option given in one place (an argument, ``generate_kwargs`` or
        ``additional_kwargs``); values are the engine's to check."""
        generate = _known("generate_kwargs", self.generate_kwargs, _GENERATE_KWARGS)
        additional = _known("additional_kwargs", self.additional_kwargs, _ADDITIONAL_KWARGS)
        places = {"as argument(s)": self.model_fields_set & set(self._fields()), "in generate_kwargs": set(generate),
                  "in additional_kwargs": set(additional)}  # fmt: skip
        for (first, names), (second, others) in itertools.combinations(places.items(), 2):
            twice = sorted(names & others)
            if twice:
                raise ValueError(f"{', '.join(twice)} given both {first} and {second}; give each once")
        _check_stop(self.generate_kwargs.get("stop"))

    @classmethod
    def class_name(cls) -> str:
        return "FusionRAGLLM"

    @property
    def engine(self) -> FusionRAG:
        """The engine (loads ``model_name`` on first use when no ``rag`` was given)."""
        if self.rag is not None:
            return self.rag
        if all(getattr(self, name) is None for name in _LOAD_SETTINGS):
            engine = _shared.resolve_rag(None, self.model_name)
        else:
            engine = _load(self.model_name, self.store, self.device, self.dtype)
        return _check_context_window(self.context_window, engine)

    @property
    def metadata(self) -> LLMMetadata:
        window = self.context_window or self.engine.context_window
        return LLMMetadata(context_window=window, num_output=self._options({})["max_new_tokens"],
                           model_name=self.model_name, is_chat_model=self._is_chat_model(),
                           is_function_calling_model=True)  # fmt: skip

    def _is_chat_model(self) -> bool:
        """As set, else whether the model has a chat template: asked of an engine at hand, not loaded for
        it (a model loaded by name always has one; ChatML stands in where its tokenizer has none)."""
        if self.is_chat_model is not None:
            return self.is_chat_model
        return self.rag is None or _has_chat_template(self.rag)

    def _fields(self) -> dict:
        return {"method": self.method, "recompute_ratio": self.recompute_ratio, "method_options": self.method_options,
                "max_new_tokens": self.max_new_tokens,
                "temperature": self.temperature}  # fmt: skip

    def _options(self, kwargs: dict) -> dict:
        """Options for ``rag.generate``: fields, then ``additional_kwargs``, then ``generate_kwargs``, then
        this call's ``kwargs``; the sampling ones become the engine's ``sampling``.

        ``stop`` is the engine's but not a shared per-call option, so it is checked and added here.
        """
        generate = _shared.respell(self.generate_kwargs)
        defaults = {**self._fields(), **_shared.respell(self.additional_kwargs), **generate}
        defaults.pop("stop", None)
        kwargs = dict(kwargs)
        if "max_tokens" in kwargs:  # the constructor's alias holds per call too
            if "max_new_tokens" in kwargs:
                raise ValueError("max_new_tokens is given twice, as 'max_new_tokens' and as 'max_tokens'; give it once")
            kwargs["max_new_tokens"] = kwargs.pop("max_tokens")
        stop = _check_stop(kwargs.pop("stop", None)) or _check_stop(generate.get("stop"))
        options = _shared.call_options(defaults, kwargs)
        return {**options, "stop": stop} if stop else options

    def _prompt(self, prompt: str, formatted: bool):
        """A formatted prompt goes as it is; else ``completion_to_prompt`` applies and ``system_prompt``
        becomes the chat's system message (LlamaIndex's ``predict`` formats and prepends it itself)."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("the prompt is empty; pass a non-empty string")
        if formatted:
            return prompt
        prompt = prompt if self.completion_to_prompt is None else self.completion_to_prompt(prompt)
        if not self.system_prompt:
            return prompt
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": prompt}]

    def _job(self, request, kwargs: dict, tools: Any = None, stream: bool = False) -> Callable[[], tuple[Any, int]]:
        """The blocking part of a call (loading, prefill, decoding) as a function returning the engine's
        result (its stream with ``stream``) and the retrieved chunks the prompt did not hold; options are
        checked now. ``tools``: the request's ``tool_calls.ToolPlan``."""
        options = self._options(kwargs)
        checked = _CHECKED.get()
        unmatched = checked[1] if checked is not None and checked[0] == request else 0
        _CHECKED.set(None)
        request = _shared.for_tenant(request, self.tenant, tools)
        return lambda: ((self.engine.stream if stream else self.engine.generate)(request, **options), unmatched)

    # LlamaIndex formats every template here (predict, stream and their async forms): where the prompt
    # arguments carry retrieved context, the formatted prompt is checked to hold its registered chunks.
    def _get_prompt(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        formatted = super()._get_prompt(prompt, **prompt_args)
        context = _context(prompt_args)
        return formatted if context is None else self._check(formatted, context, str.replace)

    def _get_messages(self, prompt: BasePromptTemplate, **prompt_args: Any) -> list[ChatMessage]:
        messages = super()._get_messages(prompt, **prompt_args)
        context = _context(prompt_args)
        if context is None:
            return messages
        try:
            chat = chat_dicts(messages)
        except ValueError:  # chat() raises it where the messages are sent
            return messages
        checked = self._check(chat, context, replace_in_chat)
        if checked == chat:
            return messages
        return [ChatMessage(role=message.role, content=text["content"], additional_kwargs=message.additional_kwargs)
                for message, text in zip(messages, checked)]  # fmt: skip

    def _check(self, request, context, replace):
        """``request`` with retrieved ``context`` checked: what to send (a list repr undone), logged once per cause."""
        checked = _retrieved.check_request(self.engine, request, context, replace, self.tenant)
        _retrieved.report(checked, self._warned, type(self).__name__)
        _CHECKED.set((checked.request, checked.unmatched))
        return checked.request

    # structured_predict and its async and streaming forms (and as_structured_llm, which calls them) run
    # LlamaIndex's own program, with each call constrained to JSON that validates against output_cls
    def structured_predict(self, output_cls: Any, prompt: Any, llm_kwargs: Optional[dict] = None, **prompt_args: Any):
        return super().structured_predict(output_cls, prompt, _json_kwargs(output_cls, llm_kwargs), **prompt_args)

    async def astructured_predict(self, output_cls: Any, prompt: Any, llm_kwargs: Optional[dict] = None,
                                  **prompt_args: Any):  # fmt: skip
        return await super().astructured_predict(output_cls, prompt, _json_kwargs(output_cls, llm_kwargs), **prompt_args)

    def stream_structured_predict(self, output_cls: Any, prompt: Any, llm_kwargs: Optional[dict] = None,
                                  **prompt_args: Any):  # fmt: skip
        return super().stream_structured_predict(output_cls, prompt, _json_kwargs(output_cls, llm_kwargs), **prompt_args)

    async def astream_structured_predict(self, output_cls: Any, prompt: Any, llm_kwargs: Optional[dict] = None,
                                         **prompt_args: Any):  # fmt: skip
        return await super().astream_structured_predict(output_cls, prompt, _json_kwargs(output_cls, llm_kwargs),
                                                        **prompt_args)  # fmt: skip

    # Each public method is decorated once and calls undecorated parts, so instrumentation events
    # fire once per call; the async ones run the blocking parts on worker threads, whose concurrent
    # requests the engine batches.
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return completion(*self._job(self._prompt(prompt, formatted), kwargs)())

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        job = self._job(self._prompt(prompt, formatted), kwargs)
        return completion(*await asyncio.to_thread(job))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return deltas(*self._job(self._prompt(prompt, formatted), kwargs, stream=True)(), completion_delta)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        job = self._job(self._prompt(prompt, formatted), kwargs, stream=True)
        return _shared.iterate_in_thread(lambda: deltas(*job(), completion_delta))

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """The whole chat goes to the model's own chat template; chunk texts in any message are found and
        reused. ``tools`` / ``tool_choice`` (from ``chat_with_tools``): the answer is a tool call
        (``get_tool_calls_from_response``) or, under "auto", a plain answer."""
        chat, tools = self._chat(messages, kwargs)
        return chat_response(*self._job(chat, kwargs, tools)(), tools=tools)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        chat, tools = self._chat(messages, kwargs)
        job = self._job(chat, kwargs, tools)
        return chat_response(*await asyncio.to_thread(job), tools=tools)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        chat, tools = self._chat(messages, kwargs)
        if tools is not None:  # a call is known once the answer is whole: one response
            return iter([chat_response(*self._job(chat, kwargs, tools)(), tools=tools)])
        return deltas(*self._job(chat, kwargs, stream=True)(), chat_delta)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        chat, tools = self._chat(messages, kwargs)
        if tools is not None:
            job = self._job(chat, kwargs, tools)
            response = chat_response(*await asyncio.to_thread(job), tools=tools)
            return _shared.iterate_in_thread(lambda: iter([response]))
        job = self._job(chat, kwargs, stream=True)
        return _shared.iterate_in_thread(lambda: deltas(*job(), chat_delta))

    def _chat(self, messages: Sequence[ChatMessage], kwargs: dict) -> tuple[list[dict], Any]:
        """The engine's chat, and the request's tools (a ``tool_calls.ToolPlan``, or None): ``tools`` and
        ``tool_choice`` leave ``kwargs``, which gains the JSON schema the answer is constrained to."""
        chat = chat_dicts(messages)
        tools = _shared.tool_plan(kwargs, lambda: self.engine)
        return (tool_calls.in_words(chat), None) if tools is None else (chat, tools)

    def _prepare_chat_with_tools(self, tools: Sequence[Any], user_msg: Any = None,
                                 chat_history: Optional[list[ChatMessage]] = None, verbose: bool = False,
                                 allow_parallel_tool_calls: bool = False, tool_required: bool = False,
                                 **kwargs: Any) -> dict[str, Any]:  # fmt: skip
        """``chat_with_tools`` / ``predict_and_call``: the chat and its tools (OpenAI's shape); one call
        per answer (``allow_parallel_tool_calls`` has nothing to add)."""
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(ChatMessage(role="user", content=user_msg) if isinstance(user_msg, str) else user_msg)
        return {"messages": messages, "tools": [tool.metadata.to_openai_tool() for tool in tools],
                "tool_choice": "required" if tool_required else "auto", **kwargs}  # fmt: skip

    def get_tool_calls_from_response(self, response: ChatResponse, error_on_no_tool_call: bool = True,
                                     **kwargs: Any) -> list[ToolSelection]:  # fmt: skip
        calls = response.message.additional_kwargs.get("tool_calls") or []
        if not calls and error_on_no_tool_call:
            raise ValueError(f"the model answered without a tool call: {response.message.content!r:.200}")
        return [ToolSelection(tool_id=call["id"], tool_name=call["name"], tool_kwargs=call["arguments"]) for call in calls]


@functools.lru_cache(maxsize=4)
def _load(name: str, store: Any, device: Any, dtype: Any) -> FusionRAG:
    """An engine loaded with explicit settings, shared by adapters given the same ones."""
    return FusionRAG.from_pretrained(name, device=device, dtype=dtype, store=store)


def _check_context_window(window: Optional[int], engine: Optional[FusionRAG] = None):
    """``window`` may only lower what the model reads; returns ``engine``."""
    if window is None:
        return engine
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"context_window must be an int >= 1, got {window!r}")
    if engine is not None and window > engine.context_window:
        raise ValueError(f"context_window={window} exceeds the model's window ({engine.context_window} tokens "
                         f"for {engine.model_name!r}); it may only lower it")  # fmt: skip
    return engine


def _json_kwargs(output_cls: Any, llm_kwargs: Optional[dict]) -> dict:
    """``llm_kwargs`` with the constraint to ``output_cls``'s JSON schema (a pydantic model class)."""
    return {**(llm_kwargs or {}), "json_schema": output_cls.model_json_schema()}


def _known(name: str, kwargs: dict, accepted: Sequence[str]) -> dict:
    """``kwargs`` (other spellings mapped) when every key is in ``accepted``; else raises naming the rest."""
    kwargs = _shared.respell(kwargs)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        spellings = ", ".join(f"{spelling} for {field}" for spelling, field in _shared.SAMPLING_SPELLINGS.items())
        raise ValueError(f"{name} has unsupported key(s) {unknown}; accepted: {', '.join(accepted)} ({spellings})")
    return kwargs


def _check_stop(stop: Any) -> list[str]:
    """Stop strings as a list (the engine checks the rest); the answer is cut before the first one."""
    stop = [stop] if isinstance(stop, str) else stop
    if stop is None:
        return []
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r:.80}")
    return [s for s in stop if s]


def _has_chat_template(engine: FusionRAG) -> bool:
    """Whether the model's tokenizer has a chat template (the engine gives ChatML to tokenizers without one)."""
    return bool(getattr(engine.tokenizer.hf, "chat_template", None))


def _context(prompt_args: dict) -> Any:
    """The retrieved context among a template's arguments, if any."""
    return next((prompt_args[name] for name in _CONTEXT_ARGUMENTS if prompt_args.get(name)), None)
