"""LlamaIndex adapters: ``FusionRAGLLM`` (a ``CustomLLM``) and ``FusionRAGIngestion`` (a ``TransformComponent``).

A stock query engine works unchanged: the ingestion component registers every node as the text the
response synthesizer will put in the prompt (``node.get_content(metadata_mode=MetadataMode.LLM)``),
and the engine finds those texts in the formatted prompt by content and serves them from their
fused KV entries.

    rag = FusionRAG.from_pretrained("smollm2-135m")
    nodes = IngestionPipeline(transformations=[SentenceSplitter(), embed_model,
                                               FusionRAGIngestion(rag=rag)]).run(documents=docs)
    index = VectorStoreIndex(nodes, embed_model=embed_model)
    answer = index.as_query_engine(llm=FusionRAGLLM(rag=rag)).query("Who built the lighthouse?")

Per-call stats travel in ``CompletionResponse.additional_kwargs["fusionrag_stats"]`` (and ``raw``),
so a ``CallbackManager`` handler (e.g. ``LlamaDebugHandler``) sees them for every LLM call.
The async methods (``acomplete``, ``achat``, ``astream_complete``, ``astream_chat``) run the engine on
worker threads, whose concurrent requests it batches, so they never block the event loop; async
streams yield deltas as tokens are decoded. Retrieved texts must fit the prompt as they are: when they exceed ``context_window - num_output``
LlamaIndex re-splits them and the pieces are computed, not reused.
"""

from __future__ import annotations

import asyncio
import functools
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
    MessageRole,
    TextBlock,
)
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.schema import BaseNode, MetadataMode, TransformComponent
from pydantic import ConfigDict, Field, model_validator

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations import _shared

__all__ = ["FusionRAGIngestion", "FusionRAGLLM"]

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
}


# What llama-index-llms-openai / -llama-cpp users write for a field here.
_SPELLINGS = {"max_tokens": "max_new_tokens", "model_path": "model_name", "model": "model_name"}
# generate_kwargs keys: the per-call options, stop strings, and greedy decoding's neutral settings.
_GENERATE_KWARGS = (*_shared.CALL_OPTIONS, "stop", "temperature", "do_sample")
_LOAD_SETTINGS = ("store", "device", "dtype")


class FusionRAGLLM(CustomLLM):
    """A LlamaIndex LLM answering with a ``FusionRAG`` engine (greedy decoding).

    Give ``rag`` (an engine) or ``model_name`` (loaded on first use with ``store``, ``device`` and
    ``dtype``, and shared by every adapter given the same ones). ``complete(prompt, stop=[...],
    method=..., recompute_ratio=..., max_new_tokens=...)`` overrides the settings for one call;
    ``generate_kwargs`` holds defaults for every call. ``temperature`` may only be 0 or None.
    ``system_prompt`` is sent as the chat's system message by ``complete(prompt)``.

    >>> llm = FusionRAGLLM(model_name="tiny", store=":memory:", max_tokens=8, context_window=2048)
    >>> llm.metadata.context_window, llm.metadata.num_output
    (2048, 8)
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=(), extra="forbid")

    rag: Optional[Any] = Field(default=None, exclude=True, description="A FusionRAG engine; None: load model_name.")
    model_name: str = Field(default=_shared.DEFAULT_MODEL_NAME, description="Model to load when rag is None.")
    method: str = Field(default="fusionrag", description="One of fusionrag_llm.METHODS.")
    recompute_ratio: float = Field(default=0.15, description="Share of reused chunk tokens recomputed, in [0, 1].")
    max_new_tokens: int = Field(default=32, description="Most tokens generated per call (alias max_tokens).")
    temperature: Optional[float] = Field(default=0.0, description="0 or None: decoding is greedy.")
    context_window: Optional[int] = Field(default=None, description="Report a smaller window than the model's.")
    generate_kwargs: dict[str, Any] = Field(default_factory=dict, description="Per-call options for every call.")
    is_chat_model: bool = Field(default=False, description="Let LlamaIndex send chats (chat() uses the chat template).")
    store: Optional[Any] = Field(default=None, exclude=True, description="KV store when loading model_name.")
    device: Optional[Any] = Field(default=None, description="Device when loading model_name.")
    dtype: Optional[Any] = Field(default=None, description="Dtype when loading model_name.")

    @model_validator(mode="before")
    @classmethod
    def _map_spellings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return _shared.map_arguments(cls.__name__, data, cls.model_fields, _SPELLINGS)

    @model_validator(mode="after")
    def _check_settings(self) -> "FusionRAGLLM":
        _shared.check_rag(self.rag)
        _shared.check_temperature(self.temperature)
        self._check_generate_kwargs()
        _shared.check_run({"method": self.method, "recompute_ratio": self.recompute_ratio})
        _shared.check_max_new_tokens(self.max_new_tokens)
        _check_context_window(self.context_window)
        if self.rag is not None:
            given = [name for name in _LOAD_SETTINGS if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: only used when the adapter loads model_name; the engine "
                                 "given as rag= is already loaded (pass them to FusionRAG.from_pretrained)")  # fmt: skip
            self.model_name = self.rag.loaded.name
            _check_context_window(self.context_window, self.rag)
        return self

    def _check_generate_kwargs(self) -> None:
        kwargs = dict(self.generate_kwargs)
        unknown = sorted(set(kwargs) - set(_GENERATE_KWARGS))
        if unknown:
            accepted = ", ".join(_GENERATE_KWARGS)
            raise ValueError(f"generate_kwargs has unsupported key(s) {unknown}; accepted: {accepted}")
        twice = sorted(set(kwargs) & self.model_fields_set - {"stop", "temperature"})
        if twice:
            raise ValueError(f"{', '.join(twice)} given both as argument(s) and in generate_kwargs; give each once")
        if kwargs.pop("do_sample", False) is not False:
            raise ValueError("generate_kwargs do_sample must be False: FusionRAG decodes greedily")
        _check_stop(kwargs.pop("stop", None))
        _shared.call_options(self._fields(), kwargs)

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
                           model_name=self.model_name, is_chat_model=self.is_chat_model)  # fmt: skip

    def _fields(self) -> dict:
        return {"method": self.method, "recompute_ratio": self.recompute_ratio, "max_new_tokens": self.max_new_tokens}

    def _options(self, kwargs: dict) -> dict:
        """Options for ``rag.generate``: fields, then ``generate_kwargs``, then this call's ``kwargs``.

        ``stop`` is the engine's but not a shared per-call option, so it is checked and added here.
        """
        defaults = {key: value for key, value in self.generate_kwargs.items() if key not in ("stop", "do_sample")}
        kwargs = dict(kwargs)
        stop = _check_stop(kwargs.pop("stop", None)) or _check_stop(self.generate_kwargs.get("stop"))
        options = _shared.call_options({**self._fields(), **defaults}, kwargs)
        options.pop("temperature", None)
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

    def _job(self, run, request, kwargs: dict) -> Callable[[], Any]:
        """The blocking part of a call (loading, prefill, decoding) as a function; options are checked now."""
        options = self._options(kwargs)
        return lambda: run(self.engine, request, options)

    # Each public method is decorated once and calls undecorated parts, so instrumentation events
    # fire once per call; the async ones run the blocking parts on worker threads, whose concurrent
    # requests the engine batches.
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return _completion(self._job(_shared.generate, self._prompt(prompt, formatted), kwargs)())

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        job = self._job(_shared.generate, self._prompt(prompt, formatted), kwargs)
        return _completion(await asyncio.to_thread(job))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return _deltas(self._job(_shared.stream, self._prompt(prompt, formatted), kwargs)(), _completion_delta)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        job = self._job(_shared.stream, self._prompt(prompt, formatted), kwargs)
        return _shared.iterate_in_thread(lambda: _deltas(job(), _completion_delta))

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """The whole chat goes to the model's own chat template (chunk texts in any message are found)."""
        return _chat_response(self._job(_shared.generate, _chat(messages), kwargs)())

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        job = self._job(_shared.generate, _chat(messages), kwargs)
        return _chat_response(await asyncio.to_thread(job))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return _deltas(self._job(_shared.stream, _chat(messages), kwargs)(), _chat_delta)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        job = self._job(_shared.stream, _chat(messages), kwargs)
        return _shared.iterate_in_thread(lambda: _deltas(job(), _chat_delta))


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
                         f"for {engine.loaded.name!r}); it may only lower it")  # fmt: skip
    return engine


def _check_stop(stop: Any) -> list[str]:
    """Stop strings as a list (the engine checks the rest); the answer is cut before the first one."""
    stop = [stop] if isinstance(stop, str) else stop
    if stop is None:
        return []
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r:.80}")
    return [s for s in stop if s]


def _completion(out) -> CompletionResponse:
    return CompletionResponse(text=out.text, **_extras(out.stats, out.token_ids, out.finish_reason))


def _completion_delta(text: str, delta: str, extras: dict) -> CompletionResponse:
    return CompletionResponse(text=text, delta=delta, **extras)


def _chat_response(out) -> ChatResponse:
    return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=out.text),
                        **_extras(out.stats, out.token_ids, out.finish_reason))  # fmt: skip


def _chat_delta(text: str, delta: str, extras: dict) -> ChatResponse:
    return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta, **extras)


def _extras(stats, token_ids, finish_reason: Optional[str] = None) -> dict:
    stats = stats.to_dict()
    raw = {"token_ids": list(token_ids), "stats": stats, "finish_reason": finish_reason}
    return {"additional_kwargs": {"fusionrag_stats": stats}, "raw": raw}


def _deltas(stream, make):
    """Yield one response per text delta, then a last one with the final stats.

    The last delta is the text the stream held back and never yielded (an incomplete UTF-8 tail),
    usually empty, so that the deltas always add up to the final text.
    """
    text = ""
    try:
        for delta in stream:
            text += delta
            yield make(text, delta, _extras(stream.stats, stream.token_ids))
    finally:  # a consumer that stops early takes the request out of the engine's batch
        stream.close()
    rest = stream.text[len(text) :] if stream.text.startswith(text) else ""
    yield make(text + rest, rest, _extras(stream.stats, stream.token_ids, stream.finish_reason))


def _chat(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    chat = []
    for index, message in enumerate(messages):
        if message.role not in _ROLES:
            raise ValueError(f"messages[{index}] has role {message.role.value!r}; supported: system, user, assistant")
        if any(not isinstance(block, TextBlock) for block in message.blocks):
            raise ValueError(f"messages[{index}] holds non-text content; FusionRAGLLM takes text only")
        chat.append({"role": _ROLES[message.role], "content": message.content or ""})
    return chat


class FusionRAGIngestion(TransformComponent):
    """Registers nodes in the engine's KV store as they are indexed (plain and, with ``fuse``, fused entries).

    Each node is registered as ``node.get_content(metadata_mode=MetadataMode.LLM)``, the text the
    response synthesizer puts in the prompt. ``node.embedding`` is reused for the neighbour search
    when every node has one (put the embed model before this component), else the engine's
    embedder runs. Nodes are returned unchanged; registering them again computes nothing.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=(), extra="forbid")

    rag: Optional[Any] = Field(default=None, exclude=True, description="A FusionRAG engine; None: load model_name.")
    model_name: str = Field(default=_shared.DEFAULT_MODEL_NAME, description="Model to load when rag is None.")
    fuse: bool = Field(default=True, description="Also compute fused entries (with the nearest neighbours).")
    neighbors: int = Field(default=10, ge=0, description="Neighbours per fused entry.")
    progress: bool = Field(default=False, description="Progress bars while entries are computed.")

    @model_validator(mode="after")
    def _check_settings(self) -> "FusionRAGIngestion":
        _shared.check_rag(self.rag)
        return self

    @classmethod
    def class_name(cls) -> str:
        return "FusionRAGIngestion"

    def to_dict(self, **kwargs: Any) -> dict[str, Any]:
        # IngestionPipeline's cache keys on this dict: tell engines apart, since each keeps its own chunk catalog.
        engine = _shared.resolve_rag(self.rag, self.model_name)
        return {**super().to_dict(**kwargs), "engine_session": _shared.engine_session(engine)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], **kwargs: Any) -> "FusionRAGIngestion":
        return super().from_dict({k: v for k, v in data.items() if k != "engine_session"}, **kwargs)

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        """``show_progress=True`` (as LlamaIndex's own transformations take it) shows progress bars too."""
        self.ingest(nodes, progress=self.progress or bool(kwargs.get("show_progress")))
        return nodes

    def ingest(self, nodes: Sequence[BaseNode], progress: bool | None = None):
        """Register ``nodes``; returns the engine's ``IngestReport`` (what was computed)."""
        texts = [node.get_content(metadata_mode=MetadataMode.LLM) for node in nodes]
        embeddings = [node.embedding for node in nodes]
        vectors = embeddings if nodes and all(e is not None for e in embeddings) else None
        engine = _shared.resolve_rag(self.rag, self.model_name)
        show = self.progress if progress is None else progress
        return _shared.register_texts(engine, texts, vectors, fuse=self.fuse, neighbors=self.neighbors, progress=show)
