"""LangChain RAG over the bundled demo corpus, answered with FusionRAG.

    python cookbook/langchain_rag.py                  # SmolLM2-135M-Instruct, the embedded default
    python cookbook/langchain_rag.py --model tiny     # random weights: checks the wiring in seconds
    python cookbook/langchain_rag.py --question "Who built the Keldmouth lighthouse?" --method full_attention

``add_documents`` puts the passages in a LangChain vector store and precomputes their fused KV
entries in one go (reusing the store's embeddings for the neighbour search). A plain LCEL chain
(retriever | format_docs | prompt | ChatFusionRAG) formats the retrieved passages into the prompt;
the engine finds them there and reuses their entries.
"""

from __future__ import annotations

import argparse

from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

from fusionrag_llm import FusionRAG, method_names
from fusionrag_llm.data import demo_corpus
from fusionrag_llm.integrations.langchain import ChatFusionRAG, FusionRAGEmbeddings, add_documents

PROMPT = ChatPromptTemplate.from_messages([
    ("system", "Answer the question using the documents. Reply with a short answer."),
    ("human", "Documents:\n{context}\n\nQuestion: {question}"),
])  # fmt: skip


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(doc.page_content for doc in docs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help='"smollm2-135m" (default), "tiny", a folder or a .gguf')
    parser.add_argument("--question", default=None, help="default: the first question bundled with the corpus")
    parser.add_argument("--method", default="fusionrag", choices=method_names())
    parser.add_argument("--ratio", type=float, default=0.15, help="recompute ratio in [0, 1]")
    parser.add_argument("--store", default=None, help='KV store folder or ":memory:" (default: the user cache)')
    args = parser.parse_args(argv)

    corpus = demo_corpus()
    rag = FusionRAG.from_pretrained(args.model, store=args.store)
    vector_store = InMemoryVectorStore(FusionRAGEmbeddings())  # the packaged all-MiniLM-L6-v2
    added = add_documents(rag, vector_store, [Document(page_content=p) for p in corpus["passages"]])
    print(f"indexed {len(added.ids)} passages: {added.report.plain_computed} plain and "
          f"{added.report.fused_computed} fused entries computed (0 when already stored)")  # fmt: skip

    chat = ChatFusionRAG(rag=rag, method=args.method, recompute_ratio=args.ratio, max_tokens=32)
    retriever = vector_store.as_retriever(search_kwargs={"k": 3})
    chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | PROMPT | chat
    question = args.question or corpus["questions"][0]["question"]
    reply = chain.invoke(question)

    stats = reply.response_metadata["fusionrag_stats"]
    print(f"question: {question}")
    print(f"answer:   {reply.content.strip()}")
    print(f"usage:    {reply.usage_metadata}")
    print(f"method {stats['method']} (r={stats['recompute_ratio']}): TTFT {stats['ttft_s'] * 1000:.1f} ms, "
          f"{stats['reused_tokens']} reused, {stats['recomputed_tokens']} recomputed, path hits {stats['path_hits']}")  # fmt: skip


if __name__ == "__main__":
    main()
