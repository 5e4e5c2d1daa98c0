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


class FusionRAGLLM(CustomLLM):
    """A LlamaIndex LLM answering with a ``FusionRAG`` engine (greedy decoding).

    Give ``rag`` (an engine) or ``model_name`` (loaded on first use and shared by every adapter
    given that name). ``complete(prompt, method=..., recompute_ratio=..., max_new_tokens=...)``
    overrides the fields for one call; ``temperature`` may only be 0 or None.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=(), extra="forbid")

    rag: Optional[Any] = Field(default=None, exclude=True, description="A FusionRAG engine; None: load model_name.")
    model_name: str = Field(default=_shared.DEFAULT_MODEL_NAME, description="Model to load when rag is None.")
    method: str = Field(default="fusionrag", description="One of fusionrag_llm.METHODS.")
    recompute_ratio: float = Field(default=0.15, description="Share of reused chunk tokens recomputed, in [0, 1].")
    max_new_tokens: int = Field(default=32, description="Most tokens generated per call.")

    @model_validator(mode="after")
    def _check_settings(self) -> "FusionRAGLLM":
        _shared.check_rag(self.rag)
        _shared.check_run({"method": self.method, "recompute_ratio": self.recompute_ratio})
        _shared.check_max_new_tokens(self.max_new_tokens)
        if self.rag is not None:
            self.model_name = self.rag.loaded.name
        return self

    @classmethod
    def class_name(cls) -> str:
        return "FusionRAGLLM"

    @property
    def engine(self) -> FusionRAG:
        """The engine (loads ``model_name`` on first use when no ``rag`` was given)."""
        return _shared.resolve_rag(self.rag, self.model_name)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(context_window=self.engine.context_window, num_output=self.max_new_tokens,
                           model_name=self.model_name, is_chat_model=False)  # fmt: skip

    def _options(self, kwargs: dict) -> dict:
        defaults = {"method": self.method, "recompute_ratio": self.recompute_ratio, "max_new_tokens": self.max_new_tokens}
        return _shared.call_options(defaults, kwargs)

    def _prompt(self, prompt: str, formatted: bool) -> str:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("the prompt is empty; pass a non-empty string")
        return prompt if formatted or self.completion_to_prompt is None else self.completion_to_prompt(prompt)

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


def _completion(out) -> CompletionResponse:
    return CompletionResponse(text=out.text, **_extras(out.stats, out.token_ids))


def _completion_delta(text: str, delta: str, extras: dict) -> CompletionResponse:
    return CompletionResponse(text=text, delta=delta, **extras)


def _chat_response(out) -> ChatResponse:
    return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=out.text),
                        **_extras(out.stats, out.token_ids))  # fmt: skip


def _chat_delta(text: str, delta: str, extras: dict) -> ChatResponse:
    return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta, **extras)


def _extras(stats, token_ids) -> dict:
    stats = stats.to_dict()
    return {"additional_kwargs": {"fusionrag_stats": stats}, "raw": {"token_ids": list(token_ids), "stats": stats}}


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
    yield make(text + rest, rest, _extras(stream.stats, stream.token_ids))


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
        self.ingest(nodes)
        return nodes

    def ingest(self, nodes: Sequence[BaseNode]):
        """Register ``nodes``; returns the engine's ``IngestReport`` (what was computed)."""
        texts = [node.get_content(metadata_mode=MetadataMode.LLM) for node in nodes]
        embeddings = [node.embedding for node in nodes]
        vectors = embeddings if nodes and all(e is not None for e in embeddings) else None
        engine = _shared.resolve_rag(self.rag, self.model_name)
        return _shared.register_texts(engine, texts, vectors, fuse=self.fuse, neighbors=self.neighbors)
