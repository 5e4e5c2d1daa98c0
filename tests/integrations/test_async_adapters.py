"""Async paths of both adapters, with the real frameworks: the event loop keeps running while the
engine generates, async answers equal sync ones, streams yield as tokens come, instrumentation fires
once per call, abandoned streams leave the engine; LangChain token counting is the engine's own."""

import asyncio
import time

import pytest
from langchain_core.language_models import base as langchain_base
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, get_buffer_string, trim_messages
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatStartEvent,
    LLMCompletionEndEvent,
    LLMCompletionStartEvent,
)
from llama_index.core.llms.custom import CustomLLM
from pytest_socket import disable_socket, enable_socket

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations.langchain import ChatFusionRAG, FusionRAGLLMLangChain
from fusionrag_llm.integrations.llama_index import FusionRAGLLM

TICK_S = 0.02
MAX_NEW_TOKENS = 32
CHUNKS = ["The Keldmouth lighthouse was built by Ada Brenner in 1871.", "Its lamp burned whale oil until 1902."]
QUESTIONS = ["Who built the lighthouse?", "When was it built?", "What did the lamp burn?", "Until when?"]
PROMPTS = [f"Context:\n{CHUNKS[0]}\n{CHUNKS[1]}\n\nQuestion: {q}" for q in QUESTIONS]


@pytest.fixture(scope="module")
def rag() -> FusionRAG:
    engine = FusionRAG.from_pretrained("tiny", store=":memory:")
    engine.add_chunks(CHUNKS, embeddings=[[1.0, 0.0], [0.0, 1.0]])  # no embedding model
    engine.generate(PROMPTS[0], max_new_tokens=2)  # warm up outside the timed calls
    return engine


def _llama_messages(prompt):
    return [ChatMessage(role=MessageRole.SYSTEM, content="Be brief."), ChatMessage(role=MessageRole.USER, content=prompt)]


def _langchain_messages(prompt):
    return [SystemMessage("Be brief."), HumanMessage(prompt)]


async def _joined(stream) -> list[str]:
    return [piece async for piece in stream]


async def _llama_deltas(responses) -> list[str]:
    return [r.delta async for r in await responses]


async def _langchain_deltas(chunks) -> list[str]:
    return [c.content if hasattr(c, "content") else c async for c in chunks]


def _llama(rag):
    return FusionRAGLLM(rag=rag, max_new_tokens=MAX_NEW_TOKENS)


def _chat(rag):
    return ChatFusionRAG(rag=rag, max_tokens=MAX_NEW_TOKENS)


def _lc_llm(rag):
    return FusionRAGLLMLangChain(rag=rag, max_tokens=MAX_NEW_TOKENS)


# the sync adapter call each async one is compared with
SYNC = {
    "complete": lambda rag, p: _llama(rag).complete(p).text,
    "chat": lambda rag, p: _llama(rag).chat(_llama_messages(p)).message.content,
    "chat_model": lambda rag, p: _chat(rag).invoke(_langchain_messages(p)).content,
    "llm": lambda rag, p: _lc_llm(rag).invoke(p),
}

# name: (its SYNC key, the async calls over all prompts -> (texts, deltas per call or None))
CASES = {
    "llama_index.acomplete": (
        "complete",
        lambda rag: _gather([_llama(rag).acomplete(p) for p in PROMPTS], lambda r: r.text),
    ),
    "llama_index.achat": (
        "chat",
        lambda rag: _gather([_llama(rag).achat(_llama_messages(p)) for p in PROMPTS], lambda r: r.message.content),
    ),
    "llama_index.astream_complete": (
        "complete",
        lambda rag: _gather_streams([_llama_deltas(_llama(rag).astream_complete(p)) for p in PROMPTS]),
    ),
    "llama_index.astream_chat": (
        "chat",
        lambda rag: _gather_streams([_llama_deltas(_llama(rag).astream_chat(_llama_messages(p))) for p in PROMPTS]),
    ),
    "ChatFusionRAG.ainvoke": (
        "chat_model",
        lambda rag: _gather([_chat(rag).ainvoke(_langchain_messages(p)) for p in PROMPTS], lambda r: r.content),
    ),
    "ChatFusionRAG.astream": (
        "chat_model",
        lambda rag: _gather_streams([_langchain_deltas(_chat(rag).astream(_langchain_messages(p))) for p in PROMPTS]),
    ),
    "ChatFusionRAG.abatch": (
        "chat_model",
        lambda rag: _one([_chat(rag).abatch([_langchain_messages(p) for p in PROMPTS])], lambda r: r.content),
    ),
    "FusionRAGLLMLangChain.ainvoke": (
        "llm",
        lambda rag: _gather([_lc_llm(rag).ainvoke(p) for p in PROMPTS], str),
    ),
    "FusionRAGLLMLangChain.astream": (
        "llm",
        lambda rag: _gather_streams([_langchain_deltas(_lc_llm(rag).astream(p)) for p in PROMPTS]),
    ),
    "FusionRAGLLMLangChain.abatch": (
        "llm",
        lambda rag: _one([_lc_llm(rag).abatch(PROMPTS)], str),
    ),
}


async def _gather(calls, text_of):
    return [text_of(result) for result in await asyncio.gather(*calls)], None


async def _gather_streams(calls):
    deltas = await asyncio.gather(*calls)
    return ["".join(d) for d in deltas], deltas


async def _one(calls, text_of):
    (results,) = await asyncio.gather(*calls)
    return [text_of(result) for result in results], None


async def _with_ticker(work):
    """Run ``work`` while a task ticks every TICK_S; returns its result, the ticks and the seconds."""
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(TICK_S)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)  # the ticker starts before the work
    start = time.perf_counter()
    result = await work
    elapsed = time.perf_counter() - start
    ticker.cancel()
    return result, ticks, elapsed


# A free loop ticks at least this share of the ticks the elapsed time allows; a blocked one ticks only
# between calls. Not higher: on 2 cores the loop competes with the engine's compute threads.
FREE_LOOP_SHARE = 0.25


@pytest.fixture(scope="module")
def sync_answers(rag):
    """The sync answers to PROMPTS, per SYNC key, computed once."""
    answers = {}

    def of(key):
        if key not in answers:
            answers[key] = [SYNC[key](rag, p) for p in PROMPTS]
        return answers[key]

    return of


@pytest.mark.parametrize("name", list(CASES))
def test_async_call_keeps_the_loop_running_and_answers_like_sync(rag, sync_answers, name):
    sync_key, async_calls = CASES[name]
    expected = sync_answers(sync_key)
    (texts, deltas), ticks, elapsed = asyncio.run(_with_ticker(async_calls(rag)))
    assert texts == expected
    assert ticks >= FREE_LOOP_SHARE * elapsed / TICK_S, f"{ticks} ticks in {elapsed:.3f}s: the event loop was blocked"
    if deltas is not None:  # streams yield as tokens come, not once at the end
        assert all(len([d for d in call if d]) > 1 for call in deltas)
    assert not rag.engine.has_unfinished()


def test_the_ticker_sees_a_blocked_loop(rag):
    """The check above can fail: CustomLLM's inherited acomplete generates on the loop thread."""
    llm = FusionRAGLLM(rag=rag, max_new_tokens=MAX_NEW_TOKENS)

    async def blocking():
        for prompt in PROMPTS[:2]:
            await CustomLLM.acomplete(llm, prompt)

    _, ticks, elapsed = asyncio.run(_with_ticker(blocking()))
    if elapsed < 10 * TICK_S:
        pytest.skip(f"generation too fast here ({elapsed:.3f}s) to tell a blocked loop")
    assert ticks < FREE_LOOP_SHARE * elapsed / TICK_S


class EventCounter(BaseEventHandler):
    counts: dict = {}

    def handle(self, event, **kwargs) -> None:
        self.counts[type(event).__name__] = self.counts.get(type(event).__name__, 0) + 1


@pytest.fixture
def events():
    handler = EventCounter(counts={})
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(handler)
    yield handler.counts
    dispatcher.event_handlers.remove(handler)


@pytest.mark.parametrize(
    ("name", "start", "end"),
    [
        ("llama_index.acomplete", LLMCompletionStartEvent, LLMCompletionEndEvent),
        ("llama_index.astream_complete", LLMCompletionStartEvent, LLMCompletionEndEvent),
        ("llama_index.achat", LLMChatStartEvent, LLMChatEndEvent),
        ("llama_index.astream_chat", LLMChatStartEvent, LLMChatEndEvent),
    ],
)
def test_llama_index_events_fire_once_per_async_call(rag, events, name, start, end):
    asyncio.run(CASES[name][1](rag))
    counted = {kind: events.get(kind.__name__, 0) for kind in (start, end)}
    assert counted == {start: len(PROMPTS), end: len(PROMPTS)}
    others = {LLMCompletionStartEvent, LLMCompletionEndEvent, LLMChatStartEvent, LLMChatEndEvent} - {start, end}
    assert all(events.get(kind.__name__, 0) == 0 for kind in others)  # a chat is not also a completion


@pytest.fixture
def aborts(rag, monkeypatch):
    """Return values of the engine's ``abort``: True means a running request was stopped."""
    calls, abort = [], rag.engine.abort
    monkeypatch.setattr(rag.engine, "abort", lambda request_id: calls.append(abort(request_id)) or calls[-1])
    return calls


async def _abandon_after_one(open_stream, rag) -> bool:
    stream = await open_stream()
    async for _ in stream:
        break
    del stream  # dropped, not closed: the loop finalizes it
    for _ in range(500):
        if not rag.engine.has_unfinished():
            return True
        await asyncio.sleep(0.01)
    return False


@pytest.mark.parametrize("framework", ["llama_index", "langchain_chat", "langchain_llm"])
def test_an_abandoned_async_stream_stops_its_request(rag, aborts, framework):
    long = 1000  # far more than the few steps the check waits for

    async def open_stream():
        if framework == "llama_index":
            return await FusionRAGLLM(rag=rag, max_new_tokens=long).astream_complete(PROMPTS[0])
        if framework == "langchain_chat":
            return ChatFusionRAG(rag=rag, max_tokens=long).astream(_langchain_messages(PROMPTS[0]))
        return FusionRAGLLMLangChain(rag=rag, max_tokens=long).astream(PROMPTS[0])

    assert asyncio.run(_abandon_after_one(open_stream, rag)), "the abandoned request kept running in the engine"
    assert True in aborts  # stopped while running, not left to finish its 1000 tokens


def test_async_errors_reach_the_caller(rag):
    async def calls():
        with pytest.raises(ValueError, match="unknown method"):
            await FusionRAGLLM(rag=rag).acomplete("Hello there", method="magic")
        with pytest.raises(ValueError, match="prompt is empty"):
            await FusionRAGLLM(rag=rag).astream_complete("  ")
        with pytest.raises(ValueError, match="unknown method"):
            await ChatFusionRAG(rag=rag).ainvoke("Hello there", method="magic")
        with pytest.raises(ValueError, match="unknown method"):
            await _joined(FusionRAGLLMLangChain(rag=rag).astream("Hello there", method="magic"))

    asyncio.run(calls())


CHAT = [SystemMessage("Be brief."), HumanMessage("Who built the Keldmouth lighthouse?"),
        AIMessage("Ada Brenner, in 1871."), HumanMessage(f"Context:\n{CHUNKS[1]}\n\nWhat did its lamp burn?")]  # fmt: skip


@pytest.fixture
def offline(monkeypatch):
    """No sockets, and LangChain's fallback tokenizer (a GPT-2 download) refuses to run."""

    def refuse(text):
        raise AssertionError("LangChain's default (GPT-2) tokenizer was used")

    monkeypatch.setattr(langchain_base, "_get_token_ids_default_method", refuse)
    disable_socket()
    yield
    enable_socket()


def test_token_counts_are_the_engines_own_and_offline(rag, offline):
    chat, llm = _chat(rag), _lc_llm(rag)
    dicts = [{"role": r, "content": m.content} for r, m in zip(["system", "user", "assistant", "user"], CHAT)]
    assert chat.get_num_tokens_from_messages(CHAT) == sum(len(s.token_ids) for s in rag.segments(dicts))
    assert chat.get_num_tokens(CHUNKS[0]) == len(rag.tokenizer.encode(CHUNKS[0])) == len(llm.get_token_ids(CHUNKS[0]))
    assert llm.get_num_tokens_from_messages(CHAT) == sum(len(s.token_ids) for s in rag.segments(get_buffer_string(CHAT)))
    assert chat.get_num_tokens_from_messages([]) == 0 == llm.get_num_tokens_from_messages([])
    # counts of partial chats (ending with an AI message, or reversed) come from the same template
    assert 0 < chat.get_num_tokens_from_messages(CHAT[:3]) < chat.get_num_tokens_from_messages(CHAT)
    assert chat.get_num_tokens_from_messages(CHAT[::-1]) > 0


def test_token_counts_equal_what_the_model_reads(rag):
    chat, llm = _chat(rag), _lc_llm(rag)
    assert chat.invoke(CHAT).usage_metadata["input_tokens"] == chat.get_num_tokens_from_messages(CHAT)
    info = llm.generate([get_buffer_string(CHAT)]).generations[0][0].generation_info
    assert info["fusionrag_stats"]["prompt_tokens"] == llm.get_num_tokens_from_messages(CHAT)


def test_trim_messages_with_the_model_as_token_counter(rag, offline):
    chat = _chat(rag)
    budget = chat.get_num_tokens_from_messages(CHAT) - 1
    last = trim_messages(CHAT, max_tokens=budget, token_counter=chat, strategy="last", include_system=True,
                         start_on="human")  # fmt: skip
    assert last == [CHAT[0], CHAT[3]] and chat.get_num_tokens_from_messages(last) <= budget
    first = trim_messages(CHAT, max_tokens=budget, token_counter=chat, strategy="first")
    assert first == CHAT[:3]
