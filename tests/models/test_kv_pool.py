"""Request caches carved from one pool: spans taken first-fit and given back when a cache is dropped,
and a decode step over pooled caches (one write and one attention call per layer) gives the tokens of
per-sequence caches."""

import gc

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.kernels._common import HAS_TRITON
from fusionrag_llm.methods import get_method, make_plan
from fusionrag_llm.models.attention_backend import TritonAttention
from fusionrag_llm.models.kv_pool import KVPool, KVPools

CHUNKS = ["Ferries leave Keldmouth twice a day.", "The lighthouse was built in 1872.", "Sheep graze the cliffs."]


def test_spans_are_taken_first_fit_cleared_and_given_back_when_the_cache_is_dropped():
    pool = KVPool(2, 1, 4, 10, torch.float32, "cpu")
    a, b = pool.allocate(4), pool.allocate(3)
    assert (a.pool_start, b.pool_start, pool.free_slots) == (0, 4, 3)
    assert pool.allocate(4) is None  # 3 free slots left
    b.keys.fill_(7.0)
    b.valid[:] = True
    assert pool.keys[:, :, 4:7].eq(7.0).all()  # a cache's tensors are views of the pool
    del b
    gc.collect()
    assert pool.free_slots == 6
    c = pool.allocate(6)  # the freed span and the tail, merged
    assert c.pool_start == 4 and not c.valid.any() and not c.keys.any()  # cleared for its new owner
    with pytest.raises(ValueError, match="at least one slot"):
        pool.allocate(0)


def test_pools_make_another_pool_when_none_has_room_and_none_for_a_cache_larger_than_a_pool():
    slot_bytes = 2 * 2 * 1 * 4 * 4  # K and V, 2 layers, 1 head of 4 floats
    pools = KVPools(2, 1, 4, torch.float32, torch.device("cpu"), pool_bytes=8 * slot_bytes)
    first, second = pools.new_cache(6), pools.new_cache(6)
    assert len(pools.pools) == 2 and first.pool is not second.pool
    assert pools.new_cache(9) is None  # larger than a pool: the caller makes a dense cache


def test_the_first_pool_holds_the_schedulers_slots_halved_while_the_device_has_less(monkeypatch):
    slot_bytes = 2 * 2 * 1 * 4 * 4
    pools = KVPools(2, 1, 4, torch.float32, torch.device("cpu"), pool_bytes=8 * slot_bytes)
    cache = pools.new_cache(6, first_slots=100)
    assert pools.pools[0].slots == 100  # every sequence the scheduler admits fits in it: one call for all
    assert [pools.new_cache(30, first_slots=5).pool for _ in range(3)] == [cache.pool] * 3  # later ones fill it
    made = []
    original = KVPool.__init__

    def short(self, *args):  # a device with room for 30 slots
        made.append(args[3])
        if args[3] > 30:
            raise torch.OutOfMemoryError("out of memory")
        original(self, *args)

    monkeypatch.setattr(KVPool, "__init__", short)
    halved = KVPools(2, 1, 4, torch.float32, torch.device("cpu"))
    assert halved.new_cache(20, first_slots=100).pool.slots == 25 and made == [100, 50, 25]
    made.clear()
    assert KVPools(2, 1, 4, torch.float32, torch.device("cpu")).new_cache(40, first_slots=100) is None
    assert made == [100, 50]  # half of 50 would not hold the cache: a dense one instead


@pytest.mark.slow  # the engine through the Triton interpreter
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_an_engine_sizes_its_first_pool_by_the_schedulers_slots():
    from fusionrag_llm.engine.scheduler import SchedulerConfig

    rag = pooled()
    rag.engine.runner.pools = KVPools.of(rag.engine.model)
    rag.engine.scheduler.config = SchedulerConfig(max_kv_tokens=321)
    rag.generate(RAGRequest(chunks=CHUNKS[:2], question="When was the lighthouse built?"), max_new_tokens=2)
    assert [pool.slots for pool in rag.engine.runner.pools.pools] == [321]


@pytest.mark.gpu
def test_on_cuda_the_scheduler_holds_half_the_free_memory_in_one_pool():
    from fusionrag_llm.engine.model_runner import KV_MEMORY_SHARE

    rag = build("triton", "cuda")
    free = torch.cuda.mem_get_info()[0]
    slots = rag.engine.scheduler.limit("max_kv_tokens")
    per_slot = KVPools.of(rag.engine.model).slot_bytes
    most = 256 * rag.engine.model.cfg.max_position_embeddings  # 256 sequences of the whole window
    assert rag.engine.scheduler.limit("max_num_seqs") == 256
    assert slots == most or abs(slots * per_slot - free * KV_MEMORY_SHARE) <= 0.05 * free  # as the engine started
    assert slots <= most
    rag.generate(RAGRequest(chunks=CHUNKS[:2], question="When was the lighthouse built?"), max_new_tokens=2)
    assert [pool.slots for pool in rag.engine.runner.pools.pools] == [slots]


def build(kernels: str, device: str = "cpu", **options) -> FusionRAG:
    rag = FusionRAG.from_pretrained("tiny", device=device, dtype="float32", store=":memory:",
                                    options={"prefix_cache": False, "kernels": kernels, **options})  # fmt: skip
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.7, 0.7], [0, 1]], neighbors=1)
    return rag


def pooled(**options) -> FusionRAG:
    """A Triton-backend engine whose request caches come from pools, as on CUDA (here through the
    interpreter)."""
    rag = build("triton", **options)
    rag.engine.runner.pools = KVPools.of(rag.engine.model, pool_bytes=4 << 20)
    return rag


def pooled_calls(monkeypatch, seen=lambda step: len(step.slots)) -> list:
    """What ``seen`` says of each pooled attention call from now on (default: its rows)."""
    calls = []
    attend = TritonAttention.attend_pooled
    monkeypatch.setattr(TritonAttention, "attend_pooled", lambda self, q, step, layer: calls.append(seen(step))
                        or attend(self, q, step, layer))  # fmt: skip
    return calls


@pytest.mark.slow  # the engine through the Triton interpreter
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_a_decode_step_over_pooled_caches_gives_the_tokens_of_separate_caches(monkeypatch):
    requests = [RAGRequest(chunks=CHUNKS, question="When?"), RAGRequest(chunks=CHUNKS[::-1], question="Who built it?")]
    sampling = {"ignore_eos": True}
    reference = build("torch")  # the recompute reads pooled caches through views too: fusionrag first
    want = [o.token_ids for o in reference.generate_many(requests, "fusionrag", 0.3, 3, sampling=sampling)]
    pooled_steps = pooled_calls(monkeypatch)
    rag = pooled()
    model = rag.engine.model
    got = [o.token_ids for o in rag.generate_many(requests, "fusionrag", 0.3, 3, sampling=sampling)]
    assert got == want
    assert 2 in pooled_steps  # decode steps of both sequences in one call per layer
    assert any(rows > 2 for rows in pooled_steps)  # and their sparse prefills (with fusionrag's KV shift hook)
    # pools too small to share: each cache alone in a pool or a dense one, each sequence attends alone
    rag.engine.runner.pools = KVPools.of(model, pool_bytes=KVPools.of(model).slot_bytes * 150)
    pooled_steps.clear()
    want = [o.token_ids for o in reference.generate_many(requests, "full_reuse", None, 3, sampling=sampling)]
    assert [o.token_ids for o in rag.generate_many(requests, "full_reuse", None, 3, sampling=sampling)] == want
    assert not pooled_steps


@pytest.mark.slow  # the engine through the Triton interpreter
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_pooled_prefills_wait_for_each_layer_of_stored_kv_arriving_layer_by_layer(monkeypatch):
    requests = [RAGRequest(chunks=CHUNKS, question="When?"), RAGRequest(chunks=CHUNKS[1:], question="Who?")]
    want = [o.token_ids for o in build("torch").generate_many(requests, "fusionrag", 0.3, 2)]
    rows = pooled_calls(monkeypatch)
    rag = pooled(layerwise_load=True)
    assert [o.token_ids for o in rag.generate_many(requests, "fusionrag", 0.3, 2)] == want
    assert any(count > 2 for count in rows)  # both prefills in one call per layer, entries fed layer by layer


@pytest.mark.slow  # the engine through the Triton interpreter
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_a_step_with_a_causal_prefill_still_pools_the_others(monkeypatch):
    """Full attention's prefill is a causal block the span kernel does not take: it attends on its own, and
    the step's decode tokens and sparse prefills still share one write and one call per layer."""
    check_mixed_steps(monkeypatch, pooled(), build("torch"))


@pytest.mark.gpu
def test_a_step_with_a_causal_prefill_still_pools_the_others_on_cuda(monkeypatch):
    reference = build("triton", "cuda")
    reference.engine.runner.pools = None  # every cache dense, every sequence alone
    check_mixed_steps(monkeypatch, build("triton", "cuda"), reference)


def check_mixed_steps(monkeypatch, rag: FusionRAG, reference: FusionRAG) -> None:
    fused, full, greedy = make_plan("fusionrag", 0.3), make_plan("full_attention", 1.0), {"ignore_eos": True}
    questions = ["When?", "Who built it?", "Where?", "Why?", "How?"]
    requests = [RAGRequest(chunks=CHUNKS[i % 3 :] + CHUNKS[: i % 3], question=q) for i, q in enumerate(questions)]

    def run(rag, mixed, calls):
        engine = rag.engine
        add = lambda i, plan: engine.add_request(rag.segments(requests[i]), plan, 6, sampling=greedy)  # noqa: E731

        def step():
            before = len(calls)
            engine.step()
            mixed.append(calls[before:])

        seqs = [add(0, fused), add(1, fused)]
        engine.step()
        engine.step()  # both prefilled, then one decode step of the two
        seqs.append(add(2, full))
        step()  # the causal prefill and the two decode tokens
        seqs += [add(3, fused), add(4, full)]
        step()  # a sparse prefill, a causal one and three decode tokens
        engine.run_until_finished(seqs)
        return [seq.token_ids for seq in seqs]

    want = run(reference, [], [])
    members = pooled_calls(monkeypatch, lambda step: step.members)
    mixed = []  # the pooled calls of each mixed step
    assert run(rag, mixed, members) == want
    layers = rag.engine.model.cfg.num_layers
    assert [one for one in mixed[0] if one is not None] == [(1, 2)] * layers  # the two decodes
    # the sparse prefill (first), then the three decodes; the causal prefill between them on its own
    assert [one for one in mixed[1] if one is not None] == [(0, 2, 3, 4)] * layers


@pytest.mark.slow  # the engine through the Triton interpreter
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_the_answers_of_one_request_decode_in_one_pooled_call(monkeypatch):
    """``n`` answers fork the prompt's KV into caches of the pool: their decode steps share one call."""
    check_forks_pooled(monkeypatch, pooled(), build("torch"))


@pytest.mark.gpu
def test_the_answers_of_one_request_decode_in_one_pooled_call_on_cuda(monkeypatch):
    reference = build("triton", "cuda")
    reference.engine.runner.pools = None
    rag = build("triton", "cuda")
    rag.engine.model.cuda_graphs = False  # a replayed graph makes no Python call to count
    check_forks_pooled(monkeypatch, rag, reference)


def check_forks_pooled(monkeypatch, rag: FusionRAG, reference: FusionRAG) -> None:
    request, sampling = RAGRequest(chunks=CHUNKS, question="When?"), {"temperature": 0.8, "seed": 3, "ignore_eos": True}

    def answers(rag):
        first = rag.generate(request, "fusionrag", 0.3, 4, sampling=sampling, n=3)
        return [first.token_ids, *(other.token_ids for other in first.others)]

    want = answers(reference)
    rows = pooled_calls(monkeypatch)
    assert answers(rag) == want and len({tuple(t) for t in want}) > 1  # three answers, drawn apart
    assert rows.count(3) == 3 * rag.engine.model.cfg.num_layers  # three decode steps of the three answers


@pytest.mark.slow  # the engine through the Triton interpreter
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_a_cache_a_method_makes_after_the_prefill_decodes_in_the_pool(monkeypatch):
    """A3's decode KV eviction makes each request a smaller cache after its prefill: it moves into the
    pool, so the two requests' decode steps are one call per layer."""
    requests = [RAGRequest(chunks=CHUNKS, question="When?"), RAGRequest(chunks=CHUNKS[::-1], question="Who built it?")]
    evicting = get_method("a3", decode_kv_budget=4)
    want = [o.token_ids for o in build("torch").generate_many(requests, evicting, None, 3, sampling={"ignore_eos": True})]
    rows = pooled_calls(monkeypatch)
    rag = pooled()
    got = [o.token_ids for o in rag.generate_many(requests, evicting, None, 3, sampling={"ignore_eos": True})]
    assert got == want
    assert rows.count(2) == 2 * rag.engine.model.cfg.num_layers  # both decode steps of both requests
