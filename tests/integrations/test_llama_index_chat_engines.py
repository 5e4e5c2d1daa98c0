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
from merging_tokenizer import REGISTERED, bpe_rag, registered_twin

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


def test_a_space_glued_to_a_chunk_is_no_cause_and_a_letter_is_named_as_the_cause(calls, caplog):
    """With a merging tokenizer: after "Context: " a node that starts "Keldmouth" is found (all but that
    word, which the space glues to: " Keldmouth" is one token) and nothing is said; after "Context: Un" a
    node that starts "The" is not ("UnThe" is one token), and as the prompt holds its text unchanged, the
    warning names the tokens at its edges, not a rewriting template."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    rag = registered_twin(bpe_rag())
    said = []
    for text, glue, unmatched in ((REGISTERED[1], " ", 0), (REGISTERED[3], " Un", 1)):
        index = VectorStoreIndex([TextNode(text=text)], embed_model=BagOfWordsEmbedding())
        template = PromptTemplate("Context:" + glue + "{context_str}\nQuestion: {query_str}\nAnswer:")
        engine = index.as_query_engine(llm=FusionRAGLLM(rag=rag, max_new_tokens=2), text_qa_template=template)
        engine.query("Which town is on Varrow?")
        stats = calls[-1][2]
        assert stats["unmatched_chunks"] == unmatched and stats["path_hits"]["chunk"] == 1 - unmatched
        said.append([r.getMessage() for r in caplog.records if r.name == LOGGER])
    assert stats_reused(calls[0][2]) == len(rag.tokenizer.encode(REGISTERED[1])) - 1
    assert said[0] == [] and len(said[1]) == 1
    assert "1 of 1 retrieved chunks are not reused: the prompt holds their text" in said[1][0]
    assert "template" not in said[1][0]


def stats_reused(stats: dict) -> int:
    """Chunk tokens served from entries: reused as they are, or picked and recomputed."""
    return stats["reused_tokens"] + stats["recomputed_tokens"]


@pytest.mark.real_model
def test_condense_plus_context_reuses_every_chunk_on_the_default_model(smollm2_rag, corpus, calls, caplog):
    """LlamaIndex's own context prompt is indented: its first node follows two spaces, and SmolLM2's
    tokenizer glues the second one to the node's first word (" passage", where the node alone starts
    "pass" "age"). The node is still found: all of it but that first word is reused, and nothing is warned."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    rag = FusionRAG(smollm2_rag.engine.loaded, store=":memory:")
    documents = [Document(text=text, metadata={"passage": i}) for i, text in enumerate(corpus["passages"])]
    embed = BagOfWordsEmbedding()
    steps = [SentenceSplitter(chunk_size=256), embed, FusionRAGIngestion(rag=rag, neighbors=2)]
    index = VectorStoreIndex(IngestionPipeline(transformations=steps).run(documents=documents), embed_model=embed)
    llm = FusionRAGLLM(rag=rag, max_new_tokens=8)
    engine = index.as_chat_engine(chat_mode="condense_plus_context", llm=llm, similarity_top_k=2)
    for turn in TURNS:
        engine.chat(turn)
    stats = calls[-1][2]
    assert stats["unmatched_chunks"] == 0 and stats["path_hits"]["chunk"] + stats["path_hits"]["exact"] == 2
    assert stats["reused_tokens"] > 0
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == []
