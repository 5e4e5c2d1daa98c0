"""Decode steps replayed from CUDA graphs give the tokens of the same steps run layer by layer, over
pooled caches (one attention call per layer, padded to a captured size) and over separate ones."""

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.methods import make_plan
from fusionrag_llm.models.decode_graphs import DecodeGraphs, captured_size
from fusionrag_llm.models.forward import ForwardOutput, ForwardPass
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.kernels._common import HAS_TRITON
from fusionrag_llm.models.attention_backend import TritonAttention, span_offsets
from fusionrag_llm.models.kv_pool import KVPool, KVPools

CHUNKS = ["Ferries leave Keldmouth twice a day.", "The lighthouse was built in 1872.", "Sheep graze the cliffs."]
REQUESTS = [RAGRequest(chunks=CHUNKS, question="When?"), RAGRequest(chunks=CHUNKS[::-1], question="Who built it?")]
SAMPLING = {"ignore_eos": True}


def triton_rag(kernels: str = "triton", device: str = "cuda") -> FusionRAG:
    rag = FusionRAG.from_pretrained("tiny", device=device, dtype="float32", store=":memory:",
                                    options={"prefix_cache": False, "kernels": kernels})  # fmt: skip
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.7, 0.7], [0, 1]], neighbors=1)
    return rag


def answers(rag: FusionRAG) -> list[list[int]]:
    one = [rag.generate(request, "fusionrag", 0.3, 12, sampling=SAMPLING).token_ids for request in REQUESTS]
    return one + [out.token_ids for out in rag.generate_many(REQUESTS, "fusionrag", 0.3, 12, sampling=SAMPLING)]


def eager_first(run) -> tuple[FusionRAG, list[list[int]]]:
    """A CUDA engine, and what ``run`` gives on it without graphs (none captured); graphs on again."""
    rag = triton_rag()
    rag.engine.model.cuda_graphs = False
    eager = run(rag)
    assert rag.engine.model.decode_graphs.captured == 0
    rag.engine.model.cuda_graphs = True
    return rag, eager


@pytest.mark.gpu
def test_captured_decode_steps_give_the_eager_tokens_and_follow_moved_weights():
    rag, eager = eager_first(answers)
    model = rag.engine.model
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


def test_captured_sizes_are_powers_of_two_to_eight_then_multiples_of_eight():
    sizes = [captured_size(n) for n in range(1, 34)]
    assert sizes[:8] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert sizes[8:] == [16] * 8 + [24] * 8 + [32] * 8 + [40]
    assert captured_size(256) == 256 and captured_size(249) == 256
    with pytest.raises(ValueError, match="at least one sequence"):
        captured_size(0)


def test_a_pooled_step_is_padded_with_rows_of_the_pools_own_slot_and_separate_caches_are_not():
    pool = KVPool(2, 1, 4, 10, torch.float32, "cpu")
    caches = [pool.allocate(3) for _ in range(3)]
    step = ForwardPass(torch.tensor([5]), torch.tensor([2]), torch.tensor([2]), decode=True)
    graphs = DecodeGraphs()
    steps, padded = graphs.padded([step] * 3, caches)
    assert padded[:3] == caches and padded[3] is pool.padding and len(steps) == 4
    pad = steps[3]
    assert (pad.token_ids.tolist(), pad.positions.tolist(), pad.slots.tolist(), pad.decode) == ([0], [0], [0], True)
    assert pool.padding.pool_start == pool.slots == 10 and pool.padding.length == 1  # past every span
    assert pool.free_slots == 1 and pool.allocate(2) is None  # the padding slot is never handed out
    assert graphs.padded([step] * 4, [*caches, pool.allocate(1)])[1][-1] is not pool.padding  # 4: a size already
    dense = [KVCache.empty(2, 1, 4, 3, torch.float32, "cpu") for _ in range(3)]
    assert graphs.padded([step] * 3, dense) == ([step] * 3, dense)  # a graph per set of caches: no padding


QUESTIONS = ["When?", "Who built it?", "Where?", "Why?", "How?", "Which?"]


def shrinking_batch(rag: FusionRAG) -> list[list[int]]:
    """Six requests whose answers end one step apart: after the first answer ends, every decode step has
    one sequence fewer than the last (6, 5, 4, 3, 2, 1)."""
    engine, plan = rag.engine, make_plan("fusionrag", 0.3)
    seqs = [engine.add_request(rag.segments(RAGRequest(chunks=CHUNKS[i % 3 :] + CHUNKS[: i % 3], question=q)), plan,
                               12 - i, sampling=SAMPLING) for i, q in enumerate(QUESTIONS)]  # fmt: skip
    engine.run_until_finished(seqs)
    return [seq.token_ids for seq in seqs]


@pytest.mark.gpu
def test_a_batch_that_shrinks_as_answers_end_replays_the_graphs_of_its_padded_sizes():
    rag, eager = eager_first(shrinking_batch)
    model = rag.engine.model
    assert shrinking_batch(rag) == eager and model.decode_graphs.failed is None
    # 6 and 5 sequences run as 8 rows, 4 and 3 as 4: two graphs (one per count would capture only the 6's)
    assert model.decode_graphs.captured >= 2 and model.decode_graphs.memory_pools == 1  # the graphs share one


def graph_body_eagerly(graphs, model, steps, caches, weights):
    """What a captured step computes, run without CUDA: ``DecoderLM.graph_body`` over the step's inputs
    and the attention offsets in buffers of their own, as ``decode_graphs._Graph`` feeds them."""
    inputs = torch.stack([torch.cat([getattr(step, name) for step in steps]) for name in ("token_ids", "positions", "slots")])
    offsets = torch.tensor(span_offsets(caches, True))
    graph_steps = [ForwardPass(inputs[0, i : i + 1], inputs[1, i : i + 1], inputs[2, i : i + 1], decode=True)
                   for i in range(len(steps))]  # fmt: skip
    logits = model.graph_body(graph_steps, list(caches), offsets)
    return [ForwardOutput(logits=logits[i : i + 1]) for i in range(len(steps))]


@pytest.mark.slow  # the engine through the Triton interpreter
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("replay", ["eager", "graph_body"])
def test_decode_steps_padded_to_a_captured_size_give_the_tokens_of_unpadded_ones(monkeypatch, replay):
    """The padded step run eagerly, and the captured step's body (offsets from its own buffer), through
    the interpreter over pooled caches (as on CUDA)."""
    import fusionrag_llm.models.llama as llama

    want = shrinking_batch(triton_rag("torch", "cpu"))
    monkeypatch.setattr(llama, "graphable", lambda model, steps, caches: all(
        step.decode and len(step.slots) == 1 and not step.hooks for step in steps))  # fmt: skip
    monkeypatch.setattr(DecodeGraphs, "run", graph_body_eagerly if replay == "graph_body" else lambda *args: None)
    rows = []
    attend = TritonAttention.attend_pooled
    monkeypatch.setattr(TritonAttention, "attend_pooled", lambda self, q, step, layer: step.max_queries == 1 and
                        rows.append(len(step.slots)) or attend(self, q, step, layer))  # fmt: skip
    rag = triton_rag("triton", "cpu")
    rag.engine.runner.pools = KVPools.of(rag.engine.model, pool_bytes=4 << 20)
    assert shrinking_batch(rag) == want
    assert set(rows) == {8, 4, 2, 1}  # decode steps of 6 and 5 sequences ran as 8 rows, of 3 as 4
