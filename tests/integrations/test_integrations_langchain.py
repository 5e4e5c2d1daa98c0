"""LangChain: LCEL chains (retriever | format_docs | prompt | model) answer from fused chunk entries."""

import asyncio

import pytest
from integration_helpers import BagOfWordsEmbeddings, fused_entry_exists
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations.langchain import (
    ChatFusionRAG,
    FusionRAGDocumentTransformer,
    FusionRAGLLMLangChain,
    add_documents,
)

PROMPT = PromptTemplate.from_template("Use the context.\n\nContext:\n{context}\n\nQuestion: {question}\nAnswer:")
CHAT_PROMPT = ChatPromptTemplate.from_messages(
    [("system", "Answer from the context."), ("human", "Context:\n{context}\n\nQuestion: {question}")]
)


def format_docs(docs) -> str:
    return "\n\n".join(doc.page_content for doc in docs)


class StatsCallback(BaseCallbackHandler):
    def __init__(self):
        self.infos = []

    def on_llm_end(self, response, **kwargs) -> None:
        self.infos.append(response.generations[0][0].generation_info)


@pytest.fixture(scope="module")
def store(rag, corpus):
    vector_store = InMemoryVectorStore(BagOfWordsEmbeddings())
    embedded_before = rag.embedder.texts
    added = add_documents(rag, vector_store, [Document(page_content=p) for p in corpus["passages"]], neighbors=2)
    assert rag.embedder.texts == embedded_before, "the vector store's embeddings should have been reused"
    assert len(added.ids) == len(corpus["passages"])
    return vector_store


def _chain(store, model, prompt=PROMPT):
    retriever = store.as_retriever(search_kwargs={"k": 3})
    return {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | model


def test_add_documents_fills_both_stores_and_a_second_call_is_a_no_op(fresh_rag, corpus):
    vector_store = InMemoryVectorStore(BagOfWordsEmbeddings())
    docs = [Document(page_content=p, metadata={"n": i}) for i, p in enumerate(corpus["passages"][:4])]
    first = add_documents(fresh_rag, vector_store, docs, neighbors=2)
    assert (first.report.plain_computed, first.report.fused_computed) == (4, 4)
    assert all(fused_entry_exists(fresh_rag, doc.page_content) for doc in docs)
    second = add_documents(fresh_rag, vector_store, docs, neighbors=2)
    assert (second.report.plain_computed, second.report.fused_computed) == (0, 0)
    assert second.ids == first.ids and len(vector_store.store) == 4


def test_llm_chain_reuses_fused_chunks_and_matches_full_attention_at_ratio_one(rag, corpus, store):
    question = corpus["questions"][0]["question"]

    def ask(**settings):
        callback = StatsCallback()
        answer = _chain(store, FusionRAGLLMLangChain(rag=rag, max_tokens=8, **settings)).invoke(
            question, config={"callbacks": [callback]})  # fmt: skip
        return answer, callback.infos[-1]["fusionrag_stats"]

    _, stats = ask()
    assert stats["path_hits"]["chunk"] == 3 and stats["recomputed_tokens"] > 0 and stats["reused_tokens"] > 0
    exact_answer, exact_stats = ask(recompute_ratio=1.0)
    full_answer, full_stats = ask(method="full_attention")
    assert exact_stats["path_hits"]["chunk"] == 3 and exact_stats["generated_tokens"] > 0
    assert full_stats["method"] == "full_attention" and exact_answer == full_answer


def test_chat_chain_reuses_fused_chunks_and_matches_full_attention_at_ratio_one(rag, corpus, store):
    question = corpus["questions"][1]["question"]
    reply = _chain(store, ChatFusionRAG(rag=rag, max_tokens=8), CHAT_PROMPT).invoke(question)
    stats = reply.response_metadata["fusionrag_stats"]
    assert stats["path_hits"]["chunk"] == 3 and stats["recomputed_tokens"] > 0
    assert reply.usage_metadata == {"input_tokens": stats["prompt_tokens"], "output_tokens": stats["generated_tokens"],
                                    "total_tokens": stats["prompt_tokens"] + stats["generated_tokens"],
                                    "input_token_details": {"cache_read": stats["exact_tokens"] + stats["reused_tokens"]}}  # fmt: skip
    assert 0 < reply.usage_metadata["input_token_details"]["cache_read"] < stats["prompt_tokens"]
    exact = _chain(store, ChatFusionRAG(rag=rag, max_tokens=8, recompute_ratio=1.0), CHAT_PROMPT).invoke(question)
    full = _chain(store, ChatFusionRAG(rag=rag, max_tokens=8, method="full_attention"), CHAT_PROMPT).invoke(question)
    assert exact.response_metadata["fusionrag_stats"]["path_hits"]["chunk"] == 3
    assert exact.usage_metadata["output_tokens"] > 0 and exact.content == full.content


def test_streaming_in_chains(rag, corpus, store):
    question = corpus["questions"][2]["question"]
    llm_chain = _chain(store, FusionRAGLLMLangChain(rag=rag, max_tokens=8))
    assert "".join(llm_chain.stream(question)) == llm_chain.invoke(question)
    chat_chain = _chain(store, ChatFusionRAG(rag=rag, max_tokens=8), CHAT_PROMPT)
    chunks = list(chat_chain.stream(question))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    whole = chat_chain.invoke(question)
    assert merged.content == whole.content and merged.usage_metadata == whole.usage_metadata
    assert merged.response_metadata["fusionrag_stats"]["path_hits"]["chunk"] == 3


def test_stop_sequences_cut_the_answer_when_streaming_too(rag):
    llm = FusionRAGLLMLangChain(rag=rag, max_tokens=10, method="full_attention")
    full = llm.invoke("Tell me about the island of Varrow.")
    assert len(full) >= 4, "the tiny model should produce a few characters"
    stop = full[2:4]
    expected = full[: full.find(stop)]
    assert llm.invoke("Tell me about the island of Varrow.", stop=[stop]) == expected
    assert "".join(llm.stream("Tell me about the island of Varrow.", stop=[stop])) == expected
    chat = ChatFusionRAG(rag=rag, max_tokens=10, method="full_attention", stop=[stop])
    reply = chat.invoke("Tell me about the island of Varrow.")
    assert reply.response_metadata["finish_reason"] == "stop"
    generated = reply.response_metadata["fusionrag_stats"]["generated_tokens"]
    assert generated < 10  # decoding ended at the stop string, not at max_tokens


def test_chat_messages_go_through_the_chat_template(rag):
    chat = ChatFusionRAG(rag=rag, max_tokens=6)
    reply = chat.invoke([SystemMessage("Be brief."), HumanMessage("Hi there")])
    expected = rag.generate([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
                            max_new_tokens=6)  # fmt: skip
    assert reply.content == expected.text and reply.usage_metadata["input_tokens"] == len(expected.prompt_ids)


def test_batch_runs_concurrent_calls_safely(rag):
    chat = ChatFusionRAG(rag=rag, max_tokens=4)
    prompts = ["Where is Keldmouth?", "Who was Tamsin Orrery?", "What is Lowmarch?"]
    assert [m.content for m in chat.batch(prompts)] == [chat.invoke(p).content for p in prompts]


def test_async_calls_keep_the_stats(rag):
    llm = FusionRAGLLMLangChain(rag=rag, max_tokens=3)
    result = asyncio.run(llm.agenerate(["Where is Keldmouth?"]))
    assert result.generations[0][0].generation_info["fusionrag_stats"]["generated_tokens"] <= 3
    reply = asyncio.run(ChatFusionRAG(rag=rag, max_tokens=3).ainvoke("Where is Keldmouth?"))
    assert reply.response_metadata["fusionrag_stats"]["prompt_tokens"] > 0


def test_document_transformer_registers_once(fresh_rag, corpus):
    docs = [Document(page_content=p) for p in corpus["passages"][:3]]
    transformer = FusionRAGDocumentTransformer(fresh_rag, embeddings=BagOfWordsEmbeddings(), neighbors=2)
    assert transformer.transform_documents(docs) is docs
    assert all(fused_entry_exists(fresh_rag, doc.page_content) for doc in docs) and fresh_rag.embedder.texts == 0
    again = transformer.ingest(docs)
    assert (again.plain_computed, again.fused_computed) == (0, 0)


def test_bad_input_raises_clear_errors(rag):
    with pytest.raises(ValueError, match="unknown method"):
        ChatFusionRAG(rag=rag, method="magic")
    with pytest.raises(ValueError, match=r"recompute_ratio must be a number in \[0, 1\]"):
        FusionRAGLLMLangChain(rag=rag, recompute_ratio=2)
    with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or a number in \[0.01, 10000\]"):
        ChatFusionRAG(rag=rag, temperature=-0.8)
    llm, chat = FusionRAGLLMLangChain(rag=rag, max_tokens=2), ChatFusionRAG(rag=rag, max_tokens=2)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.invoke("")
    with pytest.raises(ValueError, match="last chat message must be a non-empty user message"):
        chat.invoke([HumanMessage("")])
    with pytest.raises(ValueError, match="unknown method"):
        chat.invoke("Hello there", method="magic")
    with pytest.raises(ValueError, match="recompute_ratio"):
        llm.invoke("Hello there", recompute_ratio=1.5)
    with pytest.raises(ValueError, match="does not support best_of=3: no beam search or best-of ranking"):
        llm.invoke("Hello there", best_of=3)
    with pytest.raises(ValueError, match="last chat message must be a non-empty user message"):
        chat.invoke([HumanMessage("add"), SystemMessage("be brief")])


def test_constructors_load_nothing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a constructor loaded a model")

    monkeypatch.setattr(FusionRAG, "from_pretrained", refuse)
    assert ChatFusionRAG(model="smollm2-135m").model_name == "smollm2-135m"
    FusionRAGLLMLangChain(model_name="smollm2-135m", max_new_tokens=4)
    FusionRAGDocumentTransformer(model_name="smollm2-135m")
