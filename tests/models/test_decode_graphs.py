"""Decode steps replayed from CUDA graphs give the tokens of the same steps run layer by layer, over
pooled caches (one attention call per layer) and over separate ones."""

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest

CHUNKS = ["Ferries leave Keldmouth twice a day.", "The lighthouse was built in 1872.", "Sheep graze the cliffs."]
REQUESTS = [RAGRequest(chunks=CHUNKS, question="When?"), RAGRequest(chunks=CHUNKS[::-1], question="Who built it?")]
SAMPLING = {"ignore_eos": True}


def triton_rag() -> FusionRAG:
    rag = FusionRAG.from_pretrained("tiny", device="cuda", dtype="float32", store=":memory:",
                                    options={"prefix_cache": False, "kernels": "triton"})  # fmt: skip
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.7, 0.7], [0, 1]], neighbors=1)
    return rag


def answers(rag: FusionRAG) -> list[list[int]]:
    one = [rag.generate(request, "fusionrag", 0.3, 12, sampling=SAMPLING).token_ids for request in REQUESTS]
    return one + [out.token_ids for out in rag.generate_many(REQUESTS, "fusionrag", 0.3, 12, sampling=SAMPLING)]


@pytest.mark.gpu
def test_captured_decode_steps_give_the_eager_tokens_and_follow_moved_weights():
    rag = triton_rag()
    model = rag.engine.model
    model.cuda_graphs = False
    eager = answers(rag)
    assert model.decode_graphs.captured == 0
    model.cuda_graphs = True
    assert answers(rag) == eager
    assert model.decode_graphs.failed is None and model.decode_graphs.captured > 0
    with torch.no_grad():  # weights changed in place: the graphs read them as they are
        model.lm_head.weight.mul_(1.5)
    model.cuda_graphs = False
    scaled = answers(rag)
    model.cuda_graphs = True
    assert answers(rag) == scaled
    model.to(torch.float64).to(torch.float32)  # new storage for every weight: new graphs, same tokens
    assert answers(rag) == scaled and model.decode_graphs.failed is None
    assert rag.engine.runner.pools is not None and rag.engine.runner.pools.pools  # pooled caches on CUDA
    rag.engine.runner.pools = None  # separate caches: a write and a call per sequence in the graph
    assert answers(rag) == scaled and model.decode_graphs.failed is None


@pytest.mark.gpu
def test_a_step_a_graph_cannot_take_runs_eagerly():
    rag = FusionRAG.from_pretrained("tiny", device="cuda", dtype="float32", store=":memory:",
                                    options={"prefix_cache": False, "kernels": "torch"})  # fmt: skip
    rag.generate(REQUESTS[0], "full_attention", 1.0, 4, sampling=SAMPLING)
    assert rag.engine.model.decode_graphs.captured == 0  # the torch backend's steps depend on the cache length


@pytest.mark.gpu
def test_one_graph_serves_any_sequences_of_a_pool_as_many_as_it_was_captured_for():
    rag = triton_rag()
    model = rag.engine.model
    pairs = [REQUESTS, [RAGRequest(chunks=CHUNKS[1:], question="Why?"), RAGRequest(chunks=CHUNKS[:2], question="Where?")]]
    model.cuda_graphs = False
    eager = [[o.token_ids for o in rag.generate_many(pair, "fusionrag", 0.3, 12, sampling=SAMPLING)] for pair in pairs]
    model.cuda_graphs = True
    graphed = [[o.token_ids for o in rag.generate_many(pair, "fusionrag", 0.3, 12, sampling=SAMPLING)] for pair in pairs]
    assert graphed == eager and model.decode_graphs.failed is None
    assert model.decode_graphs.captured == 1  # the second pair's caches replayed the first pair's graph
