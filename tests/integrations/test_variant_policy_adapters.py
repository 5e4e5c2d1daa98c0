"""The adapters pass variant_policy to the engine like every other run option."""

import pytest

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations.langchain import ChatFusionRAG
from fusionrag_llm.integrations.llama_index import FusionRAGLLM

TEXTS = ["Anna keeps the lighthouse on Skerry.", "Anna's lighthouse was built in 1890.",
         "Carl runs the ferry to Holm.", "Carl's ferry leaves at nine."]  # fmt: skip


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    rag.add_chunks(TEXTS, embeddings=[[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], neighbors=1)  # 0 <-> 1, 2 <-> 3
    return rag


def test_adapters_pass_the_policy_through(rag):
    request = f"Context:\n{TEXTS[0]}\n\n{TEXTS[2]}\n\nWho runs the ferry?"
    chat = ChatFusionRAG(rag=rag, variant_policy="overlap", recompute_ratio=0.0, max_tokens=2)
    assert chat.invoke(request).response_metadata["fusionrag_stats"]["fused_declined"] == 1
    with pytest.raises(ValueError, match="variant_policy"):
        ChatFusionRAG(rag=rag, variant_policy="sometimes")
    cfo = ChatFusionRAG(rag=rag, variant_policy="cfo", recompute_ratio=0.0, max_tokens=2).invoke(request)
    assert cfo.response_metadata["fusionrag_stats"]["fused_declined"] == 1  # its neighbour is not in front of it
    llm = FusionRAGLLM(rag=rag, recompute_ratio=0.0, max_tokens=2)
    out = llm.complete(request, variant_policy="overlap")
    assert out.raw["stats"]["fused_declined"] == 1


def test_adapters_run_the_check_policy_and_the_peer_methods(rag):
    request = f"Context:\n{TEXTS[0]}\n\n{TEXTS[2]}\n\n{TEXTS[3]}\n\nWho runs the ferry?"
    for method in ("a3", "epic", "cacheclip", "cache_craft", "ape"):  # r = 0.9: CacheClip's windows keep picks only where they crowd
        chat = ChatFusionRAG(rag=rag, method=method, recompute_ratio=0.9, max_tokens=2)
        stats = chat.invoke(request).response_metadata["fusionrag_stats"]
        recomputes = method != "ape"  # APE's chunks share positions: it recomputes none
        assert stats["method"] == method and (stats["recomputed_tokens"] > 0) == recomputes
        out = FusionRAGLLM(rag=rag, max_tokens=2).complete(request, method=method, recompute_ratio=0.9)
        assert out.raw["stats"]["method"] == method and (out.raw["stats"]["recomputed_tokens"] > 0) == recomputes
    llm = FusionRAGLLM(rag=rag, recompute_ratio=0.0, max_tokens=2)
    paper = llm.complete(request).raw["stats"]["variant_hits"]
    checked = llm.complete(request, variant_policy="check").raw["stats"]
    hits = checked["variant_hits"]
    assert paper["fused"] > 0 and hits["fused"] + hits["plain"] == paper["fused"] and checked["fused_declined"] == hits["plain"]
    with pytest.raises(ValueError, match="valid methods: .*a3, epic, cacheclip, cache_craft, ape"):
        ChatFusionRAG(rag=rag, method="lego")
