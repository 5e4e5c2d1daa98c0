"""LlamaIndex chat engines and response modes over a real VectorStoreIndex on ``tiny``: FusionRAGLLM is a
chat model, chat turns reuse the retrieved chunks' KV, and reuse that cannot happen is said, not silent."""

import asyncio
import logging

import pytest
from integration_helpers import BagOfWordsEmbedding
from llama_index.core import Document, PromptTemplate, VectorStoreIndex
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMCompletionEndEvent
from llama_index.core.ingestion import IngestionPipeline
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.schema import TextNode

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations.llama_index import FusionRAGIngestion, FusionRAGLLM

LOGGER = "fusionrag_llm.integrations._retrieved"
TURNS = ["Who built the Keldmouth lighthouse?", "And when was it finished?"]


class CallRecorder(BaseEventHandler):
    """Every LLM call's kind ("chat" or "completion"), answer text and ``fusionrag_stats``."""

    calls: list = []

    def handle(self, event, **kwargs) -> None:
        if isinstance(event, LLMChatEndEvent) and event.response is not None:
            self.calls.append(("chat", event.response.message.content, event.response.additional_kwargs["fusionrag_stats"]))
        elif isinstance(event, LLMCompletionEndEvent):
            self.calls.append(("completion", event.response.text, event.response.additional_kwargs["fusionrag_stats"]))


@pytest.fixture
def calls():
    handler = CallRecorder(calls=[])
    get_dispatcher().add_event_handler(handler)
    yield handler.calls
    get_dispatcher().event_handlers.remove(handler)


@pytest.fixture(scope="module")
def rag():
    """This module's own engine: only the nodes indexed here are registered (other modules register the
    same passages without metadata, which a rewritten prompt would still contain)."""
    return FusionRAG.from_pretrained("tiny", store=":memory:")


@pytest.fixture(scope="module")
def index(rag, corpus):
    documents = [Document(text=text, metadata={"passage": i}) for i, text in enumerate(corpus["passages"])]
    embed = BagOfWordsEmbedding()
    steps = [SentenceSplitter(chunk_size=256), embed, FusionRAGIngestion(rag=rag, neighbors=2)]
    return VectorStoreIndex(IngestionPipeline(transformations=steps).run(documents=documents), embed_model=embed)


def test_a_model_with_a_chat_template_is_a_chat_model_unless_told_otherwise(rag, index, calls):
    assert FusionRAGLLM(rag=rag).metadata.is_chat_model  # tiny's tokenizer has a chat template
    assert not FusionRAGLLM(rag=rag, is_chat_model=False).metadata.is_chat_model
    for chat_model, kind in [(None, "chat"), (False, "completion")]:
        llm = FusionRAGLLM(rag=rag, max_new_tokens=4, **({} if chat_model is None else {"is_chat_model": chat_model}))
        index.as_query_engine(llm=llm, similarity_top_k=2).query(TURNS[0])
        assert calls[-1][0] == kind and calls[-1][2]["path_hits"]["chunk"] == 2


@pytest.mark.parametrize("mode", ["condense_plus_context", "context", "condense_question"])
def test_chat_engines_answer_two_turns_from_reused_chunks(rag, index, calls, mode):
    engine = index.as_chat_engine(chat_mode=mode, llm=FusionRAGLLM(rag=rag, max_new_tokens=8), similarity_top_k=2)
    first = engine.chat(TURNS[0])
    turn_one = len(calls)
    second = engine.chat(TURNS[1])
    kind, text, stats = calls[-1]  # the call that answered the second turn (after condensing, where the mode does)
    assert len(calls) > turn_one and kind == "chat" and str(second) == text and text.strip()
    assert stats["path_hits"]["chunk"] == 2 and stats["reused_tokens"] > 0 and stats["unmatched_chunks"] == 0
    assert [m.content for m in engine.chat_history][::2] == TURNS and str(first) == engine.chat_history[1].content


def test_chat_stream_chat_and_achat_reuse_chunks_alike(rag, index, calls):
    def engine():
        return index.as_chat_engine(chat_mode="context", llm=FusionRAGLLM(rag=rag, max_new_tokens=8), similarity_top_k=2)

    answers = [str(engine().chat(TURNS[0]))]
    answers.append("".join(engine().stream_chat(TURNS[0]).response_gen))
    answers.append(str(asyncio.run(engine().achat(TURNS[0]))))
    assert answers[0] == answers[1] == answers[2]
    assert [stats["path_hits"]["chunk"] for _, _, stats in calls] == [2, 2, 2]
    assert all(stats["reused_tokens"] > 0 for _, _, stats in calls)


@pytest.mark.parametrize("chat_model", [True, False])
def test_simple_summarize_list_repr_is_put_back_as_text_and_reused(rag, index, calls, caplog, chat_model):
    caplog.set_level(logging.INFO, logger=LOGGER)
    llm = FusionRAGLLM(rag=rag, max_new_tokens=4, is_chat_model=chat_model)
    engine = index.as_query_engine(llm=llm, similarity_top_k=3, response_mode="simple_summarize")
    for question in TURNS:
        engine.query(question)
        stats = calls[-1][2]
        assert stats["path_hits"]["chunk"] == 3 and stats["reused_tokens"] > 0 and stats["unmatched_chunks"] == 0
    said = [r for r in caplog.records if r.name == LOGGER]
    assert len(said) == 1 and said[0].levelno == logging.INFO and "Python list" in said[0].getMessage()


def test_a_template_that_rewrites_chunks_is_warned_once_per_adapter_and_counted(rag, index, calls, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    flatten = {"context_str": lambda **kwargs: kwargs["context_str"].replace("\n", " ")}
    template = PromptTemplate("Context: {context_str}\nQuestion: {query_str}\nAnswer:", function_mappings=flatten)
    for _ in range(2):  # two adapters, two queries each
        engine = index.as_query_engine(llm=FusionRAGLLM(rag=rag, max_new_tokens=4), similarity_top_k=3,
                                       text_qa_template=template)  # fmt: skip
        for question in TURNS:
            engine.query(question)
            stats = calls[-1][2]
            assert stats["path_hits"]["chunk"] == 0 and stats["unmatched_chunks"] == 3
    warned = [r for r in caplog.records if r.name == LOGGER]
    assert len(warned) == 2 and all(r.levelno == logging.WARNING for r in warned)
    assert "3 of 3 retrieved chunks are not reused" in warned[0].getMessage()


def test_retrieved_text_that_was_never_registered_is_warned(rag, calls, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    nodes = [TextNode(text="The harbour wall of Keldmouth was finished in 1880.")]
    index = VectorStoreIndex(nodes, embed_model=BagOfWordsEmbedding())
    index.as_query_engine(llm=FusionRAGLLM(rag=rag, max_new_tokens=2)).query("When was the wall finished?")
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warned) == 1 and "holds no registered chunk" in warned[0]
    assert calls[-1][2]["unmatched_chunks"] == 0
