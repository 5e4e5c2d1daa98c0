"""LlamaIndex: a real VectorStoreIndex query engine answers from fused chunk entries through FusionRAGLLM."""

import pytest
from integration_helpers import BagOfWordsEmbedding, fused_entry_exists
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.ingestion import IngestionCache, IngestionPipeline
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMCompletionEndEvent
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.schema import MetadataMode, TextNode

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations.llama_index import FusionRAGIngestion, FusionRAGLLM


class StatsRecorder(BaseEventHandler):
    """Collects ``fusionrag_stats`` of every LLM call (completion or chat), the way a user would observe an engine."""

    stats: list = []

    def handle(self, event, **kwargs) -> None:
        if isinstance(event, (LLMCompletionEndEvent, LLMChatEndEvent)) and event.response is not None:
            self.stats.append(event.response.additional_kwargs["fusionrag_stats"])


@pytest.fixture
def recorder():
    handler = StatsRecorder(stats=[])
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(handler)
    yield handler
    dispatcher.event_handlers.remove(handler)


def _documents(corpus):
    return [Document(text=text, metadata={"passage": i}) for i, text in enumerate(corpus["passages"])]


@pytest.fixture(scope="module")
def indexed(rag, corpus):
    """Nodes embedded by the pipeline, then registered (reusing node.embedding), then indexed."""
    embed = BagOfWordsEmbedding()
    embedded_before = rag.embedder.texts
    steps = [SentenceSplitter(chunk_size=256), embed, FusionRAGIngestion(rag=rag, neighbors=2)]
    nodes = IngestionPipeline(transformations=steps).run(documents=_documents(corpus))
    assert rag.embedder.texts == embedded_before, "node embeddings should have been reused"
    return VectorStoreIndex(nodes, embed_model=embed), nodes


def test_ingestion_registers_the_text_the_synthesizer_formats(rag, indexed):
    _, nodes = indexed
    for node in nodes:
        assert "passage: " in node.get_content(metadata_mode=MetadataMode.LLM)  # metadata is part of it
        assert fused_entry_exists(rag, node.get_content(metadata_mode=MetadataMode.LLM))


def test_query_engine_reuses_fused_chunks_and_matches_full_attention_at_ratio_one(rag, corpus, indexed, recorder):
    index, _ = indexed
    question = corpus["questions"][0]["question"]

    def ask(**settings):
        llm = FusionRAGLLM(rag=rag, max_new_tokens=8, **settings)
        answer = str(index.as_query_engine(llm=llm, similarity_top_k=3).query(question))
        return answer, recorder.stats[-1]

    _, stats = ask()
    assert stats["method"] == "fusionrag" and stats["path_hits"]["chunk"] == 3
    assert stats["recomputed_tokens"] > 0 and stats["reused_tokens"] > 0
    exact_answer, exact_stats = ask(recompute_ratio=1.0)
    full_answer, full_stats = ask(method="full_attention")
    assert exact_stats["path_hits"]["chunk"] == 3 and exact_stats["generated_tokens"] > 0
    assert full_stats["method"] == "full_attention"
    assert exact_answer == full_answer


def test_streaming_query_engine(rag, corpus, indexed, recorder):
    index, _ = indexed
    llm = FusionRAGLLM(rag=rag, max_new_tokens=8)
    question = corpus["questions"][1]["question"]
    streamed = index.as_query_engine(llm=llm, similarity_top_k=3, streaming=True).query(question)
    text = "".join(streamed.response_gen)
    assert recorder.stats[-1]["path_hits"]["chunk"] == 3
    assert text == str(index.as_query_engine(llm=llm, similarity_top_k=3).query(question))


def test_max_tokens_per_call_as_in_the_constructor(rag):
    llm = FusionRAGLLM(rag=rag, max_tokens=6)
    whole = llm.complete("Name a lighthouse keeper.").raw["token_ids"]
    short = llm.complete("Name a lighthouse keeper.", max_tokens=2).raw["token_ids"]
    assert len(whole) > 2 and short == whole[:2]  # greedy: the same answer, cut at 2 tokens
    with pytest.raises(ValueError, match="given twice"):
        llm.complete("Name a lighthouse keeper.", max_tokens=2, max_new_tokens=3)


def test_complete_stream_and_chat(rag):
    llm = FusionRAGLLM(rag=rag, max_new_tokens=6)
    whole = llm.complete("Name a lighthouse keeper.")
    responses = list(llm.stream_complete("Name a lighthouse keeper."))
    assert "".join(r.delta for r in responses) == responses[-1].text == whole.text
    last, first = responses[-1].additional_kwargs["fusionrag_stats"], whole.additional_kwargs["fusionrag_stats"]
    assert (last["prompt_tokens"], last["generated_tokens"]) == (first["prompt_tokens"], first["generated_tokens"])
    assert whole.raw["stats"]["generated_tokens"] == len(whole.raw["token_ids"])
    messages = [ChatMessage(role=MessageRole.SYSTEM, content="Be brief."),
                ChatMessage(role=MessageRole.USER, content="Hi there")]
    chat = llm.chat(messages)
    expected = rag.generate([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
                            max_new_tokens=6)  # fmt: skip
    assert chat.message.content == expected.text
    assert chat.additional_kwargs["fusionrag_stats"]["prompt_tokens"] == len(expected.prompt_ids)
    assert "".join(r.delta for r in llm.stream_chat(messages)) == expected.text
    assert llm.metadata.context_window == rag.context_window and llm.metadata.num_output == 6


def test_from_documents_with_transformations_registers_every_node_once(fresh_rag, corpus):
    component = FusionRAGIngestion(rag=fresh_rag, neighbors=2)
    index = VectorStoreIndex.from_documents(_documents(corpus)[:5], embed_model=BagOfWordsEmbedding(),
                                            transformations=[SentenceSplitter(chunk_size=256), component])  # fmt: skip
    nodes = list(index.docstore.docs.values())
    assert len(nodes) == 5 and fresh_rag.embedder.texts == 5  # no node embeddings yet: the engine's embedder ran
    assert all(fused_entry_exists(fresh_rag, n.get_content(metadata_mode=MetadataMode.LLM)) for n in nodes)
    again = component.ingest(nodes)
    assert len(again.chunk_ids) == 5 and again.plain_computed == 0 and again.fused_computed == 0
    assert component(nodes) is nodes


def test_pipeline_cache_does_not_skip_a_new_engine(rag, fresh_rag, corpus):
    cache = IngestionCache()
    docs = _documents(corpus)[:3]
    IngestionPipeline(transformations=[FusionRAGIngestion(rag=rag, neighbors=2)], cache=cache).run(documents=docs)
    IngestionPipeline(transformations=[FusionRAGIngestion(rag=fresh_rag, neighbors=2)], cache=cache).run(documents=docs)
    assert all(fused_entry_exists(fresh_rag, d.get_content(metadata_mode=MetadataMode.LLM)) for d in docs)


def test_bad_input_raises_clear_errors(rag):
    with pytest.raises(ValueError, match="unknown method"):
        FusionRAGLLM(rag=rag, method="magic")
    with pytest.raises(ValueError, match=r"recompute_ratio must be a number in \[0, 1\]"):
        FusionRAGLLM(rag=rag, recompute_ratio=1.5)
    with pytest.raises(ValueError, match="rag must be a FusionRAG"):
        FusionRAGLLM(rag="tiny")
    llm = FusionRAGLLM(rag=rag, max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.complete("  ")
    with pytest.raises(ValueError, match="unknown method"):
        llm.complete("Hello there", method="magic")
    with pytest.raises(ValueError, match="recompute_ratio"):
        llm.complete("Hello there", recompute_ratio=-0.1)
    with pytest.raises(ValueError, match="temperature must be 0 \(greedy\) or a number in \[0.01, 10000\]"):
        llm.complete("Hello there", temperature=-0.7)
    with pytest.raises(ValueError, match="unknown option"):
        llm.complete("Hello there", typical_p=0.9)
    with pytest.raises(ValueError, match="role 'function'"):
        llm.chat([ChatMessage(role=MessageRole.FUNCTION, content="42")])


def test_constructors_load_nothing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a constructor loaded a model")

    monkeypatch.setattr(FusionRAG, "from_pretrained", refuse)
    FusionRAGLLM(model_name="smollm2-135m")
    FusionRAGIngestion(model_name="smollm2-135m", fuse=False)


def test_adapters_given_one_model_name_share_one_engine(monkeypatch, tmp_path):
    from fusionrag_llm.integrations import _shared

    monkeypatch.setenv("FUSIONRAG_STORE", str(tmp_path))
    _shared._load_by_name.cache_clear()
    try:
        nodes = [TextNode(text="The harbour wall of Keldmouth was finished in 1880.", embedding=[1.0, 0.0])]
        FusionRAGIngestion(model_name="tiny", fuse=False)(nodes)
        llm = FusionRAGLLM(model_name="tiny", max_new_tokens=2)
        stats = llm.complete(f"Context: {nodes[0].text}\nWhen?").additional_kwargs["fusionrag_stats"]
        assert stats["path_hits"]["chunk"] == 1 and llm.metadata.model_name == "tiny"
    finally:
        _shared._load_by_name.cache_clear()
