"""The engine on its own thread, fed by many asyncio clients: continuous batching for the server.

One thread owns the engine's step loop. Clients ``submit`` prepared requests; the thread queues them
in the engine (``add_request``), steps while anything is waiting or running (every step admits what
fits, runs the admitted prefills and one decode token of every running answer in one batched
forward), and after each step hands every client the text its answers gained, on the client's own
event loop. Aborts (a client that disconnected or timed out) are applied between steps, so a freed
slot is taken by the next waiting request at the next step. At most ``max_waiting`` requests may
wait for admission; beyond that ``submit`` refuses at once (``Overloaded``) rather than letting
latency grow without bound.

Chunk registration (``POST /v1/chunks``) runs on a worker thread, one entry at a time under the
engine lock; between two entries it calls ``make_way``, which lets the requests waiting or running
step for up to ``INGEST_SLICE_S`` seconds first. So a chat that arrives during a long registration
waits for at most one entry, not for the whole registration.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fusionrag_llm.engine.sequence import Status
from fusionrag_llm.engine.streaming import AnswerText

logger = logging.getLogger(__name__)


class Overloaded(RuntimeError):
    """Too many requests are waiting; the client should retry later."""


class ShuttingDown(RuntimeError):
    """The server is stopping: a registration stops between two entries (a later one resumes it)."""


@dataclass(frozen=True)
class Prepared:
    """A request whose options are checked; the engine thread tokenizes it (``FusionRAG.segments``)."""

    request: Any  # a ChatRequest or a TextPrompt, each with its tenant
    plan: Any  # RunPlan
    max_new_tokens: int | None  # None: what the context window leaves, up to DEFAULT_MAX_TOKENS
    stop: tuple[str, ...]
    sampling: Any  # SamplingParams
    n: int = 1
    tools: Any = None  # the request's ToolPlan (``fusionrag_llm.tool_calls``): answers are read for calls


DEFAULT_MAX_TOKENS = 512
INGEST_SLICE_S = 0.5  # of steps for the requests between two entries of a registration


@dataclass(frozen=True)
class Update:
    """What one answer (``index`` of the request's n) gained in a step."""

    index: int
    delta: str
    finish_reason: str | None = None  # set on the answer's last update
    stats: Any = None  # its GenerationStats, on the last update


@dataclass
class _Served:
    prepared: Prepared
    deliver: Callable[[Any], None]  # thread-safe: puts an item on the client's queue
    seq: Any = None
    answers: list[AnswerText] = field(default_factory=list)
    done: set[int] = field(default_factory=set)


class EngineLoop:
    """``submit`` from any event loop; ``Update`` items (or an exception) arrive on the returned queue."""

    def __init__(self, rag, max_waiting: int = 256):
        self.rag = rag
        self.engine = rag.engine
        self.max_waiting = max_waiting
        self._incoming: queue.SimpleQueue = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False
        self._served: dict[int, _Served] = {}  # engine request id -> client
        self._pending = 0  # submitted, not yet added to the engine
        self._count_lock = threading.Lock()
        self._stepped = threading.Condition()  # notified after every step and when the engine goes idle
        self._thread = threading.Thread(target=self._run, name="fusionrag-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ client side (any thread)
    def submit(self, prepared: Prepared) -> tuple[asyncio.Queue, Callable[[], None]]:
        """Queue ``prepared``; returns its update queue and a function that aborts it."""
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue = asyncio.Queue()
        with self._count_lock:
            if self.waiting >= self.max_waiting:
                raise Overloaded(f"{self.max_waiting} requests are already waiting; retry later")
            self._pending += 1
        ticket = {"request_id": None, "aborted": False}

        def deliver(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(updates.put_nowait, item)
            except RuntimeError:  # the client's loop is gone: nobody reads on
                abort()

        def abort() -> None:
            ticket["aborted"] = True
            self._aborts.put(ticket)
            self._wake.set()

        self._incoming.put((prepared, deliver, ticket))
        self._wake.set()
        return updates, abort

    @property
    def running(self) -> int:
        return len(self.engine.scheduler.running)

    @property
    def waiting(self) -> int:
        return self._pending + len(self.engine.scheduler.waiting)

    def make_way(self, slice_s: float = INGEST_SLICE_S) -> None:
        """For a registration between two of its entries (engine lock released): returns once the
        requests submitted so far have finished or had ``slice_s`` seconds of steps, at once when there
        are none. Raises ``ShuttingDown`` when the server is stopping."""
        deadline = time.monotonic() + slice_s
        with self._stepped:
            while self._busy() and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._stepped.wait(remaining)
        if self._stopping:
            raise ShuttingDown("the server is shutting down")

    def _busy(self) -> bool:
        return self._pending > 0 or self.engine.has_unfinished()

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        with self._stepped:
            self._stepped.notify_all()
        self._thread.join(timeout=30)

    # ------------------------------------------------------------------ the engine thread
    def _run(self) -> None:
        while not self._stopping:
            self._admit_new()
            self._apply_aborts()
            if not self.engine.has_unfinished():
                self._notify_stepped()
                self._wake.wait(timeout=1.0)
                self._wake.clear()
                continue
            try:
                self.engine.step()
            except Exception as exc:  # the engine's own failure: every client hears of it
                logger.exception("engine step failed")
                self._fail_all(exc)
                continue
            self._publish()
            self._notify_stepped()
        self._fail_all(RuntimeError("the server is shutting down"))

    def _notify_stepped(self) -> None:
        with self._stepped:
            self._stepped.notify_all()

    def _admit_new(self) -> None:
        while True:
            try:
                prepared, deliver, ticket = self._incoming.get_nowait()
            except queue.Empty:
                return
            try:
                self._admit(prepared, deliver, ticket)
            finally:  # once queued in the engine: a registration's make_way never sees it nowhere
                with self._count_lock:
                    self._pending -= 1

    def _admit(self, prepared: Prepared, deliver: Callable[[Any], None], ticket: dict) -> None:
        if ticket["aborted"]:
            return
        try:
            seq = self._add(prepared)
        except Exception as exc:  # e.g. a prompt over the context window: this client only
            deliver(exc)
            return
        ticket["request_id"] = seq.request_id
        self._served[seq.request_id] = _Served(prepared, deliver, seq)

    def _add(self, prepared: Prepared):
        """Tokenize on this thread (no lock to wait for: this thread runs the steps) and queue it."""
        with self.engine.lock:  # against a registration of chunks running on another thread
            segments = self.rag.segments(prepared.request)
        max_new = prepared.max_new_tokens
        if max_new is None:
            room = self.rag.context_window - sum(len(segment.token_ids) for segment in segments)
            max_new = max(1, min(DEFAULT_MAX_TOKENS, room))
        return self.engine.add_request(segments, prepared.plan, max_new, stop=prepared.stop,
                                       sampling=prepared.sampling, n=prepared.n,
                                       tenant=prepared.request.tenant)  # fmt: skip

    def _apply_aborts(self) -> None:
        while True:
            try:
                ticket = self._aborts.get_nowait()
            except queue.Empty:
                return
            request_id = ticket["request_id"]
            if request_id is not None and self._served.pop(request_id, None) is not None:
                self.engine.abort(request_id)

    def _publish(self) -> None:
        for request_id, served in list(self._served.items()):
            seq = served.seq
            if seq.error is not None:
                served.deliver(seq.error)
                del self._served[request_id]
                continue
            if seq.status is Status.WAITING:
                continue
            if not served.answers:  # prefilled: its n answers exist now
                decode = self.engine.tokenizer.decode
                served.answers = [AnswerText(one, decode) for one in (seq, *seq.forks)]
            for index, answer in enumerate(served.answers):
                if index in served.done:
                    continue
                finished = answer.seq.finished  # read before pulling: the last tokens come with it
                delta = answer.pull()
                if finished:
                    served.done.add(index)
                    served.deliver(Update(index, delta, answer.seq.finish_reason, answer.seq.stats))
                elif delta:
                    served.deliver(Update(index, delta))
            if len(served.done) == len(served.answers):
                del self._served[request_id]

    def _fail_all(self, exc: BaseException) -> None:
        for served in self._served.values():
            served.deliver(exc)
        self._served.clear()
