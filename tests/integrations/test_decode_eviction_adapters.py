"""The adapters pass a method's options (``method_options``; here A3's ``decode_kv_budget``, its decode KV
eviction) to the engine as a setting and per call."""

import pytest

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations.langchain import ChatFusionRAG
from fusionrag_llm.integrations.llama_index import FusionRAGLLM

TEXTS = ["Anna keeps the lighthouse on Skerry.", "Anna's lighthouse was built in 1890.",
         "Carl runs the ferry to Holm.", "Carl's ferry leaves at nine."]  # fmt: skip
REQUEST = f"Context:\n{TEXTS[0]}\n\n{TEXTS[2]}\n\n{TEXTS[3]}\n\nWho runs the ferry?"


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(TEXTS, embeddings=[[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], neighbors=1)
    return rag


def test_langchain_passes_the_budget_as_a_setting_and_per_call(rag):
    chat = ChatFusionRAG(rag=rag, method="a3", method_options={"decode_kv_budget": 4}, max_tokens=2)
    stats = chat.invoke(REQUEST).response_metadata["fusionrag_stats"]
    assert stats["method_stats"]["evicted_kv_tokens"] > 0 and stats["method_stats"]["decode_kv_tokens"] > 0
    plain = ChatFusionRAG(rag=rag, method="a3", max_tokens=2)
    assert plain.invoke(REQUEST).response_metadata["fusionrag_stats"]["method_stats"] == {}  # no budget: no eviction
    per_call = plain.invoke(REQUEST, method_options={"decode_kv_budget": 4}).response_metadata["fusionrag_stats"]
    assert per_call["method_stats"] == stats["method_stats"]
    with pytest.raises(ValueError, match="decode KV eviction budget must be an int >= 1"):
        ChatFusionRAG(rag=rag, method="a3", method_options={"decode_kv_budget": 0})
    with pytest.raises(ValueError, match="method_options must be a mapping"):
        ChatFusionRAG(rag=rag, method="a3", max_tokens=2).invoke(REQUEST, method_options=4)


def test_llama_index_passes_the_budget_per_call(rag):
    llm = FusionRAGLLM(rag=rag, method="a3", max_tokens=2)
    out = llm.complete(REQUEST, method_options={"decode_kv_budget": 4})
    assert out.raw["stats"]["method_stats"]["evicted_kv_tokens"] > 0
    assert "evicted_kv_tokens" not in llm.complete(REQUEST).raw["stats"]["method_stats"]
    with pytest.raises(ValueError, match="unknown option\\(s\\) decode_kv_budget for method 'ape'; it takes none"):
        llm.complete(REQUEST, method="ape", method_options={"decode_kv_budget": 4})
