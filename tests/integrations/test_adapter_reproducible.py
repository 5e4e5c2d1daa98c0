"""``reproducible`` through the adapters: a field (LangChain), ``generate_kwargs`` (LlamaIndex) and a
per-call option each keep the answer from reading the exact KV a Full Attention request left (the
server's body field: ``tests/server/test_server_reproducible.py``)."""

import pytest
from lighthouse import CHUNKS, EMBEDDINGS, REQUEST

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations.langchain import ChatFusionRAG
from fusionrag_llm.integrations.llama_index import FusionRAGLLM

PROMPT = [{"role": "user", "content": "\n\n".join([*REQUEST.chunks, REQUEST.question])}]


@pytest.fixture()
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:")
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    return rag


def exact_reads(stats: dict) -> int:
    return stats["path_hits"]["exact"]


def test_langchain_and_llama_index_keep_answers_reproducible(rag):
    cold = exact_reads(ChatFusionRAG(rag=rag, max_tokens=2).invoke(PROMPT).response_metadata["fusionrag_stats"])
    rag.generate(PROMPT, method="full_attention", max_new_tokens=1)  # leaves the prompt's exact KV
    warm = ChatFusionRAG(rag=rag, max_tokens=2).invoke(PROMPT).response_metadata["fusionrag_stats"]
    assert exact_reads(warm) > cold
    field = ChatFusionRAG(rag=rag, max_tokens=2, reproducible=True).invoke(PROMPT).response_metadata["fusionrag_stats"]
    per_call = ChatFusionRAG(rag=rag, max_tokens=2).invoke(PROMPT, reproducible=True).response_metadata["fusionrag_stats"]
    assert exact_reads(field) == exact_reads(per_call) == cold
    from llama_index.core.llms import ChatMessage

    llm = FusionRAGLLM(rag=rag, max_new_tokens=2, generate_kwargs={"reproducible": True})
    reply = llm.chat([ChatMessage(role="user", content=PROMPT[0]["content"])])
    assert exact_reads(reply.additional_kwargs["fusionrag_stats"]) == cold
