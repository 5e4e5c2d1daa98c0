"""CPU request caches in reused memory: zeroed for each new cache, never reused while any tensor still
views it, at most KEEP buffers kept; an engine's requests run in it with the answers they get
in fresh memory."""

import gc

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.models import cache_memory
from fusionrag_llm.models.cache_memory import CacheMemory

needs_count = pytest.mark.skipif(cache_memory._use_count is None, reason="this torch cannot count a storage's users")


def test_a_cache_is_zeroed_contiguous_and_shaped_as_a_fresh_one():
    memory = CacheMemory()
    cache = memory.new_cache(2, 3, 4, 5, torch.float32, "cpu")
    for tensor, shape in ((cache.keys, (2, 3, 5, 4)), (cache.values, (2, 3, 5, 4))):
        assert tensor.shape == shape and tensor.is_contiguous() and not tensor.any()
    assert cache.keys.data_ptr() != cache.values.data_ptr() and cache.capacity == 5 and cache.length == 0
    assert (cache.positions.dtype, cache.valid.dtype, cache.groups.dtype) == (torch.long, torch.bool, torch.int32)


@needs_count
def test_a_finished_caches_memory_serves_the_next_cache_zeroed():
    memory = CacheMemory()
    first = memory.new_cache(2, 3, 4, 10, torch.float32, "cpu")
    first.keys.fill_(5.0)
    first.values.fill_(7.0)
    address = first.keys.data_ptr()
    second = memory.new_cache(2, 3, 4, 10, torch.float32, "cpu")
    assert second.keys.data_ptr() != address  # the first is still alive: its buffer is not free
    del first
    gc.collect()
    third = memory.new_cache(2, 3, 4, 8, torch.float32, "cpu")  # smaller: fits in the freed buffer
    assert third.keys.data_ptr() == address and not third.keys.any() and not third.values.any()
    assert memory.held == 2
    other = memory.new_cache(2, 3, 4, 8, torch.bfloat16, "cpu")  # another dtype: a buffer of its own
    assert other.keys.dtype == torch.bfloat16 and memory.held == 3
    del second, third
    gc.collect()
    big = memory.new_cache(2, 3, 4, 40, torch.float32, "cpu")  # larger than every free buffer: a new one
    assert big.keys.shape[2] == 40 and memory.held == 4


@needs_count
def test_a_view_kept_of_a_finished_cache_keeps_its_memory_from_reuse():
    memory = CacheMemory()
    cache = memory.new_cache(2, 1, 4, 6, torch.float32, "cpu")
    cache.values.fill_(3.0)
    kept = cache.values[:, :, 1:3]  # e.g. KV written back to a store as a view
    del cache
    gc.collect()
    again = memory.new_cache(2, 1, 4, 6, torch.float32, "cpu")
    again.values.fill_(9.0)
    assert kept.eq(3.0).all()  # not overwritten
    del kept, again
    gc.collect()
    memory.new_cache(2, 1, 4, 6, torch.float32, "cpu")
    assert memory.held == 2  # the view is gone: its buffer serves again, no third one is made


@needs_count
def test_at_most_keep_buffers_are_kept_and_a_larger_one_replaces_the_smallest_unused():
    memory = CacheMemory(keep=2)
    caches = [memory.new_cache(1, 1, 4, 3 - i, torch.float32, "cpu") for i in range(3)]  # 3, 2, 1 slots
    assert memory.held == 2  # the third cache's memory is its own: it goes when the cache does
    first, small = caches[0].keys.data_ptr(), caches[1].keys.data_ptr()
    del caches
    gc.collect()
    assert memory.new_cache(1, 1, 4, 2, torch.float32, "cpu").keys.data_ptr() == small  # the smallest that fits
    big = memory.new_cache(1, 1, 4, 9, torch.float32, "cpu")  # larger than both: replaces the 2-slot one
    address = big.keys.data_ptr()
    assert memory.held == 2
    del big
    gc.collect()
    assert memory.new_cache(1, 1, 4, 9, torch.float32, "cpu").keys.data_ptr() == address and memory.held == 2
    assert memory.new_cache(1, 1, 4, 3, torch.float32, "cpu").keys.data_ptr() == first  # the 3-slot one was kept


@needs_count
def test_an_engines_requests_reuse_cache_memory_and_answer_as_in_fresh_memory():
    chunks = ["Ferries leave Keldmouth twice a day.", "The lighthouse was built in 1872.", "Sheep graze the cliffs."]
    requests = [RAGRequest(chunks=chunks, question="When was it built?"), RAGRequest(chunks=chunks[1:], question="Who?")]

    def answers(rag):
        return [rag.generate(r, method, 0.3 if method == "fusionrag" else None, 6, sampling={"ignore_eos": True}).token_ids
                for method in ("fusionrag", "full_reuse", "full_attention") for r in requests]  # fmt: skip

    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(chunks, embeddings=[[1, 0], [0.7, 0.7], [0, 1]], neighbors=1)
    runner = rag.engine.runner
    assert runner.memory is not None
    first = answers(rag)
    assert answers(rag) == first and 1 <= runner.memory.held <= cache_memory.KEEP  # buffers served again
    runner.memory = None  # every cache in fresh memory
    assert answers(rag) == first


def test_a_runner_lets_its_buffers_go_when_the_model_leaves_the_cpu():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:")
    runner = rag.engine.runner
    runner.new_cache(4)
    assert runner.memory is not None and runner.memory.held <= 1
    rag.engine.model.to("meta")  # any device but the CPU
    assert runner.new_cache(4).keys.device.type == "meta" and runner.memory is None
