"""LangChain adapters: ``FusionRAGLLMLangChain`` (an ``LLM``), ``ChatFusionRAG`` (a ``BaseChatModel``),
``add_documents`` and ``FusionRAGDocumentTransformer`` (register documents in the KV store),
``FusionRAGEmbeddings`` (an ``Embeddings``) and ``FusionRAGRetriever`` (a ``BaseRetriever`` over the
document index of ``fusionrag ingest``).

An LCEL chain works unchanged: documents are registered as their ``page_content``, the chain formats
retrieved documents into the prompt, and the engine finds them there by content.

    rag = FusionRAG.from_pretrained("smollm2-135m")
    add_documents(rag, vector_store, docs)          # the vector store and the KV store together
    chain = ({"context": vector_store.as_retriever() | format_docs, "question": RunnablePassthrough()}
             | prompt | ChatFusionRAG(rag=rag))

Stats of every call: ``generation_info`` (LLM), ``response_metadata["fusionrag_stats"]`` and
``usage_metadata`` (chat model), so callbacks see them too. Decoding is greedy unless ``temperature`` > 0;
``top_p``, ``top_k``, ``min_p``, the repetition / frequency / presence penalties and ``seed`` are the engine's ``SamplingParams``, set on the model or per call.
``stop`` sequences cut the answer (the model stops decoding at the first one).
Async calls (``ainvoke``, ``abatch``, ``astream``) run the engine on worker threads, whose requests
it batches; the LLM's sync ``batch`` answers its prompts as one engine batch. ``get_num_tokens*`` count
with the engine's tokenizer and chat template, offline.

Constructor arguments are checked: other ecosystems' spellings that mean a field here are mapped
(``model``/``model_id``, ``max_new_tokens``/``num_predict``/``max_completion_tokens``, ``stop_sequences``,
``request_timeout``, ``repeat_penalty``); ``n``, beam search, log-probabilities, server and
context-window settings raise a ``ValueError`` saying why (their neutral values pass); anything else
raises naming the argument and listing the accepted ones.
Per-call options (``invoke`` keyword arguments, ``bind``) are checked the same way.
``with_structured_output`` and the chat model's ``bind_tools`` constrain decoding to the schema or the
tools' calls (the ``structured`` extra).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator, Optional, Sequence

from fusionrag_llm.errors import require

require("langchain_core", "langchain", "fusionrag_llm.integrations.langchain")  # a clear hint, not a bare ImportError

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.documents import BaseDocumentTransformer, Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel, LLM
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, get_buffer_string
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult, Generation, GenerationChunk, LLMResult
from langchain_core.runnables.config import run_in_executor
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.vectorstores import VectorStore
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fusionrag_llm import ChatRequest, FusionRAG, IngestReport, tool_calls
from fusionrag_llm.integrations import _langchain_options as _options
from fusionrag_llm.integrations import _shared
from fusionrag_llm.integrations._langchain_messages import chat_chunk, chat_dicts, usage, warn_tools
from fusionrag_llm.integrations._langchain_retrieval import FusionRAGEmbeddings, FusionRAGRetriever

__all__ = ["AddedDocuments", "ChatFusionRAG", "FusionRAGDocumentTransformer", "FusionRAGEmbeddings",
           "FusionRAGLLMLangChain", "FusionRAGRetriever", "add_documents"]  # fmt: skip

_CONFIG = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=(), populate_by_name=True, extra="forbid")

class _FusionRAGSettings(BaseModel):
    """Fields and call plumbing shared by the LLM and the chat model."""

    model_config = _CONFIG

    rag: Optional[Any] = Field(default=None, exclude=True, description="A FusionRAG engine; None: load model_name.")
    model_name: str = Field(default=_shared.DEFAULT_MODEL_NAME, alias="model", description="Model to load when rag is None.")
    method: str = "fusionrag"
    recompute_ratio: Optional[float] = None  # None: the method's own
    reproducible: Optional[bool] = None  # True: answers never read exact or turn KV earlier requests left
    method_options: Optional[dict[str, Any]] = None  # the method's own options, e.g. {"decode_kv_budget": 128} for a3
    max_tokens: int = 32
    stop: Optional[list[str]] = None
    # Sampling (the engine's SamplingParams; None: its default, greedy). Numbers only: True is no temperature.
    temperature: Optional[float] = Field(default=None, strict=True, description="0 or None: greedy; > 0 samples.")
    top_p: Optional[float] = Field(default=None, strict=True)
    top_k: Optional[int] = Field(default=None, strict=True)
    min_p: Optional[float] = Field(default=None, strict=True)
    repetition_penalty: Optional[float] = Field(default=None, strict=True)  # also as repeat_penalty
    frequency_penalty: Optional[float] = Field(default=None, strict=True)
    presence_penalty: Optional[float] = Field(default=None, strict=True)
    do_sample: Optional[bool] = Field(default=None, strict=True)  # False: greedy whatever the temperature
    seed: Optional[int] = Field(default=None, description="Seeds sampling; None: a fresh draw.")
    # LangChain's standard parameters, kept to be read back: a local engine sends no request to time out or retry
    timeout: Optional[float] = None
    max_retries: Optional[int] = None
    # answer for this tenant only: its registered chunks and cached KV (None: the default tenant)
    tenant: Optional[str] = Field(default=None, description="Answer for this tenant only; None: the default one.")

    @model_validator(mode="before")
    @classmethod
    def _check_arguments(cls, data: Any) -> Any:
        """Map other ecosystems' spellings to the fields; refuse unsupported and unknown arguments by name."""
        if not isinstance(data, dict):
            return data
        return _options.constructor_arguments(cls, data, set(cls.model_fields))

    @model_validator(mode="after")
    def _check_settings(self):
        _shared.check_rag(self.rag)
        self.tenant = _shared.checked_tenant(self.tenant)
        self._options({})  # the engine's own checks of every setting, sampling included
        if self.rag is not None:
            self.model_name = self.rag.model_name
        return self

    @property
    def engine(self) -> FusionRAG:
        """The engine (loads ``model_name`` on first use when no ``rag`` was given)."""
        return _shared.resolve_rag(self.rag, self.model_name)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """What sets the answer: LangChain's cache keys on it (with the call's own options)."""
        tenant = {"tenant": self.tenant} if self.tenant else {}  # another tenant's answers are never a cache hit
        return {"model_name": self.model_name, "max_tokens": self.max_tokens, **self._run_options(),
                **self._sampling_settings(), **tenant}  # fmt: skip

    def _get_ls_params(self, stop: Optional[list[str]] = None, **kwargs: Any):
        """LangChain's tracing params, with the temperature and length this call decodes with (per-call
        options, their spellings and ``do_sample=False`` counted; greedy reports temperature 0)."""
        params = super()._get_ls_params(stop=stop, **kwargs)
        try:
            options = self._options(kwargs)
        except ValueError:  # the call itself raises it, where the user sees it
            return params
        return {**params, "ls_temperature": options["sampling"].temperature, "ls_max_tokens": options["max_new_tokens"]}

    def with_structured_output(self, schema: Any = None, *, method: str = "json_schema", include_raw: bool = False,
                               **kwargs: Any):  # fmt: skip
        """A runnable whose answers are ``schema`` (a pydantic model's instance, else a dict): the model's
        decoding is constrained to JSON that validates against it (``method="json_schema"``) or to any
        JSON object (``"json_mode"``); ``include_raw``: ``{"raw", "parsed", "parsing_error"}``."""
        if kwargs:
            raise ValueError(f"unsupported argument(s) {sorted(kwargs)} for with_structured_output; it takes schema, "
                             "method and include_raw")  # fmt: skip
        from fusionrag_llm.integrations._langchain_structured import structured

        return structured(self, schema, method, include_raw)

    def _run_options(self) -> dict[str, Any]:
        options = {"method": self.method, "recompute_ratio": self.recompute_ratio,
                   "method_options": self.method_options, "seed": self.seed, "reproducible": self.reproducible}  # fmt: skip
        return {name: value for name, value in options.items() if value is not None}

    def _sampling_settings(self) -> dict[str, Any]:
        settings = {name: getattr(self, name) for name in _shared.SAMPLING_OPTIONS}
        return {name: value for name, value in settings.items() if value is not None}

    def _options(self, kwargs: dict) -> dict:
        """This call's options for the engine: the settings, updated by the call's (other spellings mapped)."""
        kwargs = {k: v for k, v in kwargs.items() if k != "stream"}  # LangChain's own streaming switch
        arguments = _options.call_arguments(type(self), kwargs)
        if "max_tokens" in arguments:
            arguments["max_new_tokens"] = arguments.pop("max_tokens")
        defaults = {**self._run_options(), "max_new_tokens": self.max_tokens, **self._sampling_settings()}
        return _shared.call_options(defaults, arguments)

    def _info(self, stats, token_ids, options: dict, stopped: bool) -> dict[str, Any]:
        reason = "stop" if stopped else _shared.finish_reason(token_ids, options["max_new_tokens"])
        return {"model_name": self.model_name, "finish_reason": reason, "fusionrag_stats": stats.to_dict()}

    def _answer(self, request, stop: Optional[list[str]], kwargs: dict) -> tuple[str, dict[str, Any]]:
        return self._answers([request], stop, kwargs)[0]

    def _answers(self, requests: list, stop: Optional[list[str]], kwargs: dict) -> list[tuple[str, dict[str, Any]]]:
        """(text, info) per request; several run as one engine batch (each answer as if alone: greedy, or each
        request drawing from its own stream of the seed)."""
        options = self._options(kwargs)
        run = {**options, "stop": [s for s in stop or self.stop or () if s]}  # decoding ends before a stop string
        requests = [_shared.for_tenant(request, self.tenant) for request in requests]
        if len(requests) == 1:
            outs = [self.engine.generate(requests[0], **run)]
        else:
            outs = self.engine.generate_many(requests, **run)
        return [(out.text, self._info(out.stats, out.token_ids, options, out.finish_reason == "stop")) for out in outs]

    def _deltas(self, request, stop: Optional[list[str]], kwargs: dict) -> Iterator[tuple[str, Optional[dict]]]:
        """(delta, None) per text delta, then ("", info) once decoding ends (the engine's stream holds back
        what may start a stop string and ends the answer before one)."""
        options = self._options(kwargs)
        stops = [s for s in stop or self.stop or () if s]
        stream = self.engine.stream(_shared.for_tenant(request, self.tenant), **options, stop=stops)
        try:
            for delta in stream:
                if delta:
                    yield delta, None
        finally:  # a consumer that stops early takes the request out of the engine's batch
            stream.close()
        yield "", self._info(stream.stats, stream.token_ids, options, stream.finish_reason == "stop")

    def _adeltas(self, request, stop: Optional[list[str]], kwargs: dict) -> AsyncIterator[tuple[str, Optional[dict]]]:
        """``_deltas`` run on a worker thread, handed to the event loop as they come."""
        return _shared.iterate_in_thread(lambda: self._deltas(request, stop, kwargs))

    def get_token_ids(self, text: str) -> list[int]:
        """The engine's own tokenizer (offline, no GPT-2 download); ``custom_get_token_ids`` wins if set."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        return self.engine.tokenizer.encode(text)


class FusionRAGLLMLangChain(_FusionRAGSettings, LLM):
    """A LangChain LLM over a ``FusionRAG`` engine; the prompt is sent as the chat template's user message."""

    model_config = _CONFIG

    @property
    def _llm_type(self) -> str:
        return "fusionrag"

    def _get_ls_params(self, stop: Optional[list[str]] = None, **kwargs: Any):
        return {**super()._get_ls_params(stop=stop, **kwargs), "ls_provider": "fusionrag"}

    def _call(self, prompt: str, stop: Optional[list[str]] = None,
              run_manager: Optional[CallbackManagerForLLMRun] = None, **kwargs: Any) -> str:  # fmt: skip
        return self._answer(prompt, stop, kwargs)[0]

    def _generate(self, prompts: list[str], stop: Optional[list[str]] = None,
                  run_manager: Optional[CallbackManagerForLLMRun] = None, **kwargs: Any) -> LLMResult:  # fmt: skip
        answers = self._answers(prompts, stop, kwargs)  # batch() sends every prompt in one call
        generations = [[Generation(text=text, generation_info=info)] for text, info in answers]
        return LLMResult(generations=generations, llm_output={"model_name": self.model_name})

    async def _agenerate(self, prompts: list[str], stop: Optional[list[str]] = None,
                         run_manager: Optional[AsyncCallbackManagerForLLMRun] = None, **kwargs: Any) -> LLMResult:  # fmt: skip
        # one worker thread per prompt: the engine batches them (abatch sends every prompt in one call)
        answers = await asyncio.gather(*(run_in_executor(None, self._answer, prompt, stop, kwargs) for prompt in prompts))
        generations = [[Generation(text=text, generation_info=info)] for text, info in answers]
        return LLMResult(generations=generations, llm_output={"model_name": self.model_name})

    def _stream(self, prompt: str, stop: Optional[list[str]] = None, run_manager: Optional[CallbackManagerForLLMRun] = None,
                **kwargs: Any) -> Iterator[GenerationChunk]:  # fmt: skip
        for delta, info in self._deltas(prompt, stop, kwargs):
            chunk = GenerationChunk(text=delta, generation_info=info)
            if run_manager and delta:
                run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk

    async def _astream(self, prompt: str, stop: Optional[list[str]] = None,
                       run_manager: Optional[AsyncCallbackManagerForLLMRun] = None,
                       **kwargs: Any) -> AsyncIterator[GenerationChunk]:  # fmt: skip
        async for delta, info in self._adeltas(prompt, stop, kwargs):
            chunk = GenerationChunk(text=delta, generation_info=info)
            if run_manager and delta:
                await run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Optional[Sequence[Any]] = None) -> int:
        """Tokens the model reads for ``messages``: as a prompt, they become one user message (buffer string)."""
        warn_tools(tools)
        return _shared.count_prompt_tokens(self.engine, get_buffer_string(messages))


class ChatFusionRAG(_FusionRAGSettings, BaseChatModel):
    """A LangChain chat model over a ``FusionRAG`` engine; messages are rendered with the model's chat template.

    >>> chat = ChatFusionRAG(model="tiny", max_tokens=8)   # loads on first use
    """

    model_config = _CONFIG

    streaming: bool = False

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Optional[Any] = None, **kwargs: Any):
        """The model with ``tools`` (LangChain tools, functions, pydantic models or OpenAI tool dicts): its
        answers are calls of them (``message.tool_calls``), or, with ``tool_choice`` "auto" (the
        default), a calls or a plain answer; "any"/"required" or a tool's name force a call, "none" none.
        The calls are constrained to the tools' JSON schemas (``fusionrag_llm.tool_calls``)."""
        formatted = [convert_to_openai_tool(tool) for tool in tools]
        tool_calls.ToolPlan.of(formatted, tool_choice)  # checked now, where the tools are given
        return self.bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    @property
    def _llm_type(self) -> str:
        return "fusionrag-chat"

    def _generate(self, messages: list[BaseMessage], stop: Optional[list[str]] = None,
                  run_manager: Optional[CallbackManagerForLLMRun] = None, **kwargs: Any) -> ChatResult:  # fmt: skip
        tools = _shared.tool_plan(kwargs, lambda: self.engine)
        chat = chat_dicts(messages)
        request = tool_calls.in_words(chat) if tools is None else ChatRequest(chat, tenant=self.tenant, tools=tools)
        text, info = self._answer(request, stop, kwargs)
        calls = []
        if tools is not None:
            text, found = tools.read(text)
            calls = [{"name": call.name, "args": call.arguments, "id": call.id, "type": "tool_call"} for call in found]
        message = AIMessage(content=text, tool_calls=calls, response_metadata=info, usage_metadata=usage(info))
        return ChatResult(generations=[ChatGeneration(message=message, generation_info=info)],
                          llm_output={"model_name": self.model_name})  # fmt: skip

    def _stream(self, messages: list[BaseMessage], stop: Optional[list[str]] = None,
                run_manager: Optional[CallbackManagerForLLMRun] = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:  # fmt: skip
        if "tools" in kwargs:  # a call is known once the answer is whole
            yield _whole_as_chunk(self._generate(messages, stop, run_manager, **kwargs))
            return
        for delta, info in self._deltas(tool_calls.in_words(chat_dicts(messages)), stop, kwargs):
            chunk = chat_chunk(delta, info)
            if run_manager and delta:
                run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk

    async def _astream(self, messages: list[BaseMessage], stop: Optional[list[str]] = None,
                       run_manager: Optional[AsyncCallbackManagerForLLMRun] = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:  # fmt: skip
        if "tools" in kwargs:  # a call is known once the answer is whole
            yield _whole_as_chunk(await run_in_executor(None, self._generate, messages, stop, None, **kwargs))
            return
        async for delta, info in self._adeltas(tool_calls.in_words(chat_dicts(messages)), stop, kwargs):
            chunk = chat_chunk(delta, info)
            if run_manager and delta:
                await run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Optional[Sequence[Any]] = None) -> int:
        """Tokens the model reads for ``messages``: the chat template, the contents and the generation prompt.

        Counted by the engine's own tokenizer, offline; ``trim_messages(..., token_counter=chat)`` works.
        """
        warn_tools(tools)
        return _shared.count_chat_tokens(self.engine, tool_calls.in_words(chat_dicts(messages)))


class FusionRAGDocumentTransformer(BaseDocumentTransformer):
    """Registers documents (their ``page_content``) in the engine's KV store; returns them unchanged.

    ``embeddings`` (e.g. the vector store's) drive the neighbour search; without them the engine's
    embedder runs. Registering the same documents again computes nothing. ``tenant``: register them for
    that tenant only (the chat model or LLM answering them takes the same ``tenant``).
    """

    def __init__(self, rag: Optional[FusionRAG] = None, *, model_name: str = _shared.DEFAULT_MODEL_NAME,
                 embeddings: Optional[Embeddings] = None, fuse: bool = True, neighbors: int = 10,
                 progress: bool = False, tenant: Optional[str] = None):  # fmt: skip
        self.rag, self.model_name = _shared.check_rag(rag), model_name
        self.embeddings, self.fuse, self.neighbors, self.progress = embeddings, fuse, neighbors, progress
        self.tenant = _shared.checked_tenant(tenant)

    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> Sequence[Document]:
        self.ingest(documents)
        return documents

    def ingest(self, documents: Sequence[Document]) -> IngestReport:
        texts = [document.page_content for document in documents]
        vectors = self.embeddings.embed_documents(texts) if self.embeddings is not None and texts else None
        engine = _shared.resolve_rag(self.rag, self.model_name)
        return _shared.register_texts(engine, texts, vectors, fuse=self.fuse, neighbors=self.neighbors,
                                      progress=self.progress, tenant=self.tenant)  # fmt: skip


def _whole_as_chunk(result: ChatResult) -> ChatGenerationChunk:
    """A whole answer (its tool calls included) as the one chunk of a stream."""
    message = result.generations[0].message
    chunks = [{"name": call["name"], "args": json.dumps(call["args"]), "id": call["id"], "index": index}
              for index, call in enumerate(message.tool_calls)]  # fmt: skip
    last = AIMessageChunk(content=message.content, tool_call_chunks=chunks, response_metadata=message.response_metadata,
                          usage_metadata=message.usage_metadata, chunk_position="last")  # fmt: skip
    return ChatGenerationChunk(message=last, generation_info=result.generations[0].generation_info)


@dataclass(frozen=True)
class AddedDocuments:
    ids: list[str]  # the vector store's ids
    report: IngestReport  # what the KV store computed


def add_documents(rag: FusionRAG, vector_store: VectorStore, documents: Sequence[Document], fuse: bool = True,
                  neighbors: int = 10, progress: bool = False, tenant: Optional[str] = None) -> AddedDocuments:  # fmt: skip
    """Add ``documents`` to ``vector_store`` and register them in ``rag``'s KV store, embedding them once.

    The vector store's embeddings drive the neighbour search; ``progress=True`` shows progress bars. Stores with ``add_embeddings`` (FAISS)
    take the vectors as they are; others embed again. Documents without an id get one derived from
    their content and metadata, so adding the same documents twice changes nothing in either store.
    ``tenant``: registered in the KV store for that tenant only (the vector store is the caller's to keep apart).
    """
    _shared.check_rag(rag)
    tenant = _shared.checked_tenant(tenant)
    documents = list(documents)
    if not documents:
        return AddedDocuments(ids=[], report=IngestReport(chunk_ids=[]))
    texts = [document.page_content for document in documents]
    ids = [document.id or _content_id(document) for document in documents]
    embeddings = vector_store.embeddings
    vectors = embeddings.embed_documents(texts) if embeddings is not None else None
    report = _shared.register_texts(rag, texts, vectors, fuse=fuse, neighbors=neighbors, progress=progress,
                                    tenant=tenant)  # fmt: skip
    if vectors is not None and hasattr(vector_store, "add_embeddings"):
        metadatas = [document.metadata for document in documents]
        stored = vector_store.add_embeddings(list(zip(texts, vectors)), metadatas=metadatas, ids=ids)
    else:
        stored = vector_store.add_documents(documents, ids=ids)
    return AddedDocuments(ids=list(stored), report=report)


def _content_id(document: Document) -> str:
    key = json.dumps([document.page_content, document.metadata], sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:32]
