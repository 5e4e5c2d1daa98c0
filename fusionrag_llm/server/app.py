"""The OpenAI-compatible HTTP app: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/models``, ``/v1/chunks``, ``/health`` and ``/metrics``, over one ``EngineLoop`` that batches
every client's requests (embeddings run in the thread pool instead: ``embeddings.py``). Each request
is served for one tenant, decided in ``server/tenants.py`` alone; each finished completion is counted
and logged in one line (``metrics.py``).

Errors have OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``): bad JSON, bad
fields, bad values and prompts over the context window are 400, a missing or wrong API key 401, a
refused chunk write 403 (``access.py``), an unknown model 404, a body over the limit 413
(``body.py``), a full queue 429, a request over its time limit 408; a stream that fails after it
started ends with an error event. A client that goes away (a closed stream, a dropped connection)
has its request aborted at the next engine step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Iterator, Mapping, Sequence

from fusionrag_llm.errors import FusionRAGError, PromptTooLongError, require
from fusionrag_llm.fusion.embeddings import DEFAULT_EMBEDDING_NAME

require("fastapi", "serve", "fusionrag serve")

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.concurrency import run_in_threadpool  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse  # noqa: E402
from starlette.exceptions import HTTPException  # noqa: E402

from fusionrag_llm.server.access import Access, KeyCheck  # noqa: E402
from fusionrag_llm.server.body import MAX_BODY_BYTES, ApiError, parse_body, read_body  # noqa: E402
from fusionrag_llm.server.embeddings import EmbeddingEndpoint, EmbeddingsRequest  # noqa: E402
from fusionrag_llm.server.engine_loop import EngineLoop, Overloaded, ShuttingDown, Update  # noqa: E402
from fusionrag_llm.server.metrics import Metrics  # noqa: E402
from fusionrag_llm.server.tenants import TenantRefused, request_tenant  # noqa: E402
from fusionrag_llm.server.protocol import (  # noqa: E402
    ChatCompletionRequest, ChunksRequest, CompletionRequest, created, error_body, fusionrag_extra, new_id, usage,
)  # fmt: skip

logger = logging.getLogger(__name__)

POLL_S = 0.5  # how often a waiting non-streamed request checks that its client is still there


def create_app(rag, served_model_name: str | None = None, max_waiting: int = 256, request_timeout: float = 600.0,
               max_body_bytes: int = MAX_BODY_BYTES, api_keys: Sequence[str] | Mapping[str, str | None] = (), chunk_writes: bool | str = True,
               embedding_model: str | None = DEFAULT_EMBEDDING_NAME) -> FastAPI:  # fmt: skip
    """The app over ``rag`` (a ``FusionRAG``); its engine thread runs while the app does.

    ``max_waiting``: requests that may wait for admission (more: 429); ``request_timeout``: seconds a
    request may take (more: 408); ``max_body_bytes``: the largest request body (more: 413).
    ``api_keys``: keys clients must send as ``Authorization: Bearer KEY`` on every route but
    ``/health`` (none: no key is asked for), or a mapping of each key to the tenant it serves (None:
    the tenant the request names); ``chunk_writes``: who may ``POST /v1/chunks``, True
    (whoever may call), False (nobody: 403) or a key (only that one) (``access.py``).
    ``embedding_model``: what ``/v1/embeddings`` serves (the packaged model's name or a
    sentence-transformers folder; None: no embeddings)."""
    access = Access.of(api_keys, chunk_writes)
    name = served_model_name or rag.model_name
    state: dict[str, EngineLoop] = {}
    registrations = _Registrations(rag, state)
    embedding = EmbeddingEndpoint(embedding_model) if embedding_model is not None else None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["loop"] = EngineLoop(rag, max_waiting=max_waiting)
        try:
            yield
        finally:
            state.pop("loop").close()

    app = FastAPI(title="fusionrag", lifespan=lifespan)
    app.add_middleware(KeyCheck, access=access)
    app.state.metrics = metrics = Metrics()
    _install_error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        loop = state["loop"]
        return {"status": "ok", "model": name, "running": loop.running, "waiting": loop.waiting,
                "registering": registrations.count}  # fmt: skip

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        """Server-wide totals in Prometheus' text format (``metrics.py``)."""
        loop = state["loop"]
        return PlainTextResponse(metrics.render(loop.running, loop.waiting), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": name, "object": "model", "created": created(), "owned_by": "fusionrag",
                "max_model_len": rag.context_window}  # fmt: skip
        extra = [embedding.card(created())] if embedding is not None and embedding.available else []
        return {"object": "list", "data": [card, *extra]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = parse_body(await read_body(request, max_body_bytes), ChatCompletionRequest)
        return await _complete(request, body, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = parse_body(await read_body(request, max_body_bytes), CompletionRequest)
        return await _complete(request, body, "text")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> dict[str, Any]:
        body = parse_body(await read_body(request, max_body_bytes), EmbeddingsRequest)
        if embedding is None or not embedding.available:
            raise _model_not_found("this server serves no embedding model (it needs the embed extra)")
        if body.model not in embedding.ids:
            raise _model_not_found(f"the embedding model {body.model!r} does not exist; this server serves {embedding.id!r}")
        try:
            return await run_in_threadpool(embedding.answer, body, body.texts())  # off the event loop and the engine
        except FusionRAGError as exc:
            raise ApiError(400, str(exc)) from exc

    @app.post("/v1/chunks")
    async def add_chunks(request: Request) -> dict[str, Any]:
        body = parse_body(await read_body(request, max_body_bytes), ChunksRequest)
        try:
            with _request_errors():
                tenant = request_tenant(request, body.tenant, body.cache_salt)
                report = await run_in_threadpool(registrations.run, body, tenant)
        except ShuttingDown as exc:  # stopped between two entries: a later call resumes
            raise ApiError(503, f"chunk registration stopped: {exc}; send it again to resume", "server_error") from exc
        return {"object": "list", "data": [{"object": "chunk", "id": chunk_id} for chunk_id in report.chunk_ids],
                "plain_computed": report.plain_computed, "fused_computed": report.fused_computed}  # fmt: skip

    @app.get("/v1/chunks")
    async def chunk_count(request: Request) -> dict[str, Any]:
        with _request_errors():
            tenant = request_tenant(request, request.query_params.get("tenant"))
        # the tenant's chunks (none but its own); waits for the engine's step, off the event loop
        count = await run_in_threadpool(lambda: len(rag.chunks_of(tenant)))
        return {"object": "chunk_count", "count": count}

    async def _complete(request: Request, body, kind: str):
        started = time.monotonic()
        if body.model != name:
            raise _model_not_found(f"the model {body.model!r} does not exist; this server serves {name!r}")
        with _request_errors():
            prepared = body.prepared(request_tenant(request, body.tenant, body.cache_salt), rag.tokenizer.tool_format)
        try:
            updates, abort = state["loop"].submit(prepared)
        except Overloaded as exc:
            raise ApiError(429, str(exc), "rate_limit_exceeded") from exc
        deadline = time.monotonic() + request_timeout
        try:
            first = await _next(request, updates, deadline)
        except BaseException:
            abort()
            raise
        reply = _Reply(body, kind, name, lambda stats, reasons: metrics.finished(
            kind, reply.id, stats, reasons, time.monotonic() - started), tools=prepared.tools)  # fmt: skip
        if not body.stream:
            try:
                return await reply.whole(first, request, updates, deadline)
            finally:
                abort()  # a no-op once every answer finished; frees the slot otherwise
        return StreamingResponse(reply.events(first, request, updates, deadline, abort), media_type="text/event-stream")

    return app


@contextmanager
def _request_errors() -> Iterator[None]:
    """The request's own errors as API errors: a tenant it may not use 403, a bad value 400."""
    try:
        yield
    except TenantRefused as exc:
        raise ApiError(403, str(exc), "permission_error", "tenant_mismatch") from exc
    except FusionRAGError as exc:
        raise ApiError(400, str(exc)) from exc


def _model_not_found(message: str) -> ApiError:
    return ApiError(404, message, "invalid_request_error", "model_not_found")


class _Registrations:
    """``POST /v1/chunks`` calls, one at a time on worker threads; each steps aside for the requests
    between two of its entries (``EngineLoop.make_way``)."""

    def __init__(self, rag, state: dict):
        self.rag, self.state = rag, state
        self.count = 0  # running or waiting for the one running
        self._one_at_a_time = threading.Lock()
        self._count_lock = threading.Lock()

    def run(self, body: ChunksRequest, tenant: str | None):
        with self._count_lock:
            self.count += 1
        try:
            with self._one_at_a_time:
                loop = self.state["loop"]
                return self.rag.add_chunks(body.texts, fuse=body.fuse, neighbors=body.neighbors, pause=loop.make_way,
                                           tenant=tenant)  # fmt: skip
        finally:
            with self._count_lock:
                self.count -= 1


async def _next(request: Request, updates: asyncio.Queue, deadline: float) -> Update:
    """The next update; raises ``ApiError`` for an engine error, a timeout or a client gone away."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ApiError(408, "the request did not finish within the server's time limit", "timeout")
        try:
            item = await asyncio.wait_for(updates.get(), min(POLL_S, remaining))
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                raise ApiError(499, "the client closed the connection", "client_closed") from None
            continue
        if isinstance(item, PromptTooLongError):
            raise ApiError(400, str(item), code="context_length_exceeded")
        if isinstance(item, FusionRAGError):
            raise ApiError(400, str(item))
        if isinstance(item, BaseException):
            logger.error("request failed: %r", item)
            raise ApiError(500, f"the engine failed on this request: {type(item).__name__}", "server_error")
        return item


class _Reply:
    """One request's response: a whole JSON object, or server-sent events as answers grow."""

    def __init__(self, body, kind: str, model: str, on_finished=None, tools=None):
        self.body, self.kind, self.model = body, kind, model
        self.tools = tools  # its ToolPlan: answers are read for calls, so each is sent whole, once finished
        self.on_finished = on_finished  # (each answer's stats, each answer's finish reason): when all finished
        self.id = new_id("chatcmpl" if kind == "chat" else "cmpl")
        self.created = created()
        self.object = "chat.completion" if kind == "chat" else "text_completion"

    async def _updates(self, first: Update, request: Request, updates: asyncio.Queue, deadline: float,
                       finals: dict[int, Update]) -> AsyncIterator[Update]:  # fmt: skip
        """Every update until each of the n answers has finished (its last update is in ``finals``)."""
        update = first
        while True:
            yield update
            if update.finish_reason is not None:
                finals[update.index] = update
            if len(finals) == self.body.n:
                return
            update = await _next(request, updates, deadline)

    async def whole(self, first: Update, request: Request, updates: asyncio.Queue, deadline: float) -> dict:
        texts, finals = [""] * self.body.n, {}
        async for update in self._updates(first, request, updates, deadline, finals):
            texts[update.index] += update.delta
        stats = self._finished(finals)
        choices = [self._choice(index, texts[index], finals[index].finish_reason) for index in range(self.body.n)]
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": choices, "usage": usage(stats), "fusionrag": fusionrag_extra(self.body, stats)}  # fmt: skip

    def _finished(self, finals: dict[int, Update]) -> list[Any]:
        """Each answer's stats, once every one has finished (then ``on_finished`` hears of it)."""
        stats = [finals[index].stats for index in range(self.body.n)]
        if self.on_finished is not None:
            self.on_finished(stats, [finals[index].finish_reason for index in range(self.body.n)])
        return stats

    def _choice(self, index: int, text: str, reason: str | None) -> dict:
        if self.kind == "chat":
            message, reason = self._message(text, reason)
            return {"index": index, "message": {"role": "assistant", **message}, "logprobs": None,
                    "finish_reason": reason}  # fmt: skip
        return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}

    def _message(self, text: str, reason: str | None) -> tuple[dict, str | None]:
        """An answer's message fields and finish reason: its tool calls when the request had tools
        and the answer is one (finish reason ``tool_calls``), else its text."""
        if not self.tools:
            return {"content": text}, reason
        content, calls = self.tools.read(text)
        if not calls:
            return {"content": content}, reason
        return {"content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
            for call in calls]}, "tool_calls"  # fmt: skip

    async def events(self, first: Update, request: Request, updates: asyncio.Queue, deadline: float,
                     abort) -> AsyncIterator[str]:  # fmt: skip
        finals: dict[int, Update] = {}
        try:
            if self.kind == "chat":  # OpenAI opens every chat choice with its role
                for index in range(self.body.n):
                    yield self._event([self._delta(index, {"role": "assistant", "content": ""}, None)])
            texts = [""] * self.body.n
            async for update in self._updates(first, request, updates, deadline, finals):
                if self.tools:  # a call is known once the answer is whole: one delta at its end
                    texts[update.index] += update.delta
                    if update.finish_reason is not None:
                        message, reason = self._message(texts[update.index], update.finish_reason)
                        for place, call in enumerate(message.get("tool_calls") or ()):
                            call["index"] = place  # a streamed call names its place among the answer's calls
                        yield self._event([self._delta(update.index, message, reason)])
                elif update.delta or update.finish_reason is not None:
                    yield self._event([self._delta(update.index, self._content(update.delta), update.finish_reason)])
            stats = self._finished(finals)
            tail: dict[str, Any] = {"fusionrag": fusionrag_extra(self.body, stats)}
            if self.body.include_usage:
                tail["usage"] = usage(stats)
            yield self._event([], **tail)
            yield "data: [DONE]\n\n"
        except ApiError as exc:  # the response has started: the error is the stream's last event
            yield f"data: {json.dumps(error_body(str(exc), exc.kind, exc.code))}\n\n"
        finally:
            abort()

    def _content(self, delta: str) -> dict:
        return {"content": delta} if delta else {}

    def _delta(self, index: int, delta: dict, reason: str | None) -> dict:
        if self.kind == "chat":
            return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {"index": index, "text": delta.get("content", ""), "logprobs": None, "finish_reason": reason}

    def _event(self, choices: list[dict], **extra: Any) -> str:
        chunk = {"id": self.id, "object": f"{self.object}.chunk" if self.kind == "chat" else self.object,
                 "created": self.created, "model": self.model, "choices": choices, **extra}  # fmt: skip
        if self.body.include_usage and "usage" not in extra:
            chunk["usage"] = None
        return f"data: {json.dumps(chunk)}\n\n"


def _install_error_handlers(app: FastAPI) -> None:
    def counted(request: Request, response: JSONResponse) -> JSONResponse:
        request.app.state.metrics.refused(response.status_code)
        return response

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return counted(request, exc.response())

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return counted(request, JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:  # a bug: still OpenAI's shape
        logger.error("request failed: %r", exc)
        return counted(request, JSONResponse(error_body(f"the server failed on this request: {type(exc).__name__}",
                                                        "server_error"), status_code=500))  # fmt: skip

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return counted(request, JSONResponse(error_body(f"invalid request: {exc.errors()[:3]}"), status_code=400))
