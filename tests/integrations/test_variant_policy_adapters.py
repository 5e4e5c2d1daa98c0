"""The adapters pass the method and its ratio to the engine (``None``: the method's own ratio), for every
peer method."""

import pytest

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations.langchain import ChatFusionRAG
from fusionrag_llm.integrations.llama_index import FusionRAGLLM

TEXTS = ["Anna keeps the lighthouse on Skerry.", "Anna's lighthouse was built in 1890.",
         "Carl runs the ferry to Holm.", "Carl's ferry leaves at nine."]  # fmt: skip


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(TEXTS, embeddings=[[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], neighbors=1)  # 0 <-> 1, 2 <-> 3
    return rag


def test_adapters_run_the_methods_own_ratio_unless_given(rag):
    request = f"Context:\n{TEXTS[0]}\n\n{TEXTS[2]}\n\nWho runs the ferry?"
    for method, own in (("fusionrag", 0.15), ("full_reuse", 0.0), ("full_attention", 1.0)):
        chat = ChatFusionRAG(rag=rag, method=method, max_tokens=2)
        assert chat.recompute_ratio is None
        assert chat.invoke(request).response_metadata["fusionrag_stats"]["recompute_ratio"] == own
        assert FusionRAGLLM(rag=rag, method=method, max_tokens=2).complete(request).raw["stats"]["recompute_ratio"] == own
    given = ChatFusionRAG(rag=rag, recompute_ratio=0.4, max_tokens=2).invoke(request)
    assert given.response_metadata["fusionrag_stats"]["recompute_ratio"] == 0.4
    with pytest.raises(ValueError, match=r"recompute_ratio must be a number in \[0, 1\]"):
        ChatFusionRAG(rag=rag, recompute_ratio=2.0)


def test_adapters_run_the_peer_methods(rag):
    request = f"Context:\n{TEXTS[0]}\n\n{TEXTS[2]}\n\n{TEXTS[3]}\n\nWho runs the ferry?"
    for method in ("a3", "epic", "cacheclip", "cache_craft", "ape"):  # r = 0.9: CacheClip's windows keep picks only where they crowd
        chat = ChatFusionRAG(rag=rag, method=method, recompute_ratio=0.9, max_tokens=2)
        stats = chat.invoke(request).response_metadata["fusionrag_stats"]
        recomputes = method != "ape"  # APE's chunks share positions: it recomputes none
        assert stats["method"] == method and (stats["recomputed_tokens"] > 0) == recomputes
        out = FusionRAGLLM(rag=rag, max_tokens=2).complete(request, method=method, recompute_ratio=0.9)
        assert out.raw["stats"]["method"] == method and (out.raw["stats"]["recomputed_tokens"] > 0) == recomputes
    cfo = ChatFusionRAG(rag=rag, method="cache_craft", recompute_ratio=0.0, max_tokens=2).invoke(request)
    assert cfo.response_metadata["fusionrag_stats"]["method_stats"]["fused_declined"] >= 1  # their neighbours are not in front
    with pytest.raises(ValueError, match="valid methods: .*a3, epic, cacheclip, cache_craft, ape"):
        ChatFusionRAG(rag=rag, method="lego")
