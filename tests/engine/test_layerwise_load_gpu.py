"""Layer-wise loading on a GPU: entries held in pinned host memory reach the request cache on a
stream of their own while the forward runs, with the same answers and logits as placing them whole
first (logits to float32's last digits: the two ways reach the same KV, and GPU kernels may sum in
another order from one launch to the next)."""

import pytest
import torch

from fusionrag_llm import FusionRAG
from fusionrag_llm.fusion.layer_feed import LayerFeed
from fusionrag_llm.storage import StoreBudgets, TieredStore
from lighthouse import CHUNKS, EMBEDDINGS, REQUEST

pytestmark = pytest.mark.gpu

METHODS = (("full_reuse", 0.0), ("fusionrag", 0.15), ("cacheblend", 0.15), ("cache_craft", 0.3), ("full_attention", 1.0))


def cuda_engine(layerwise, dtype):
    store = TieredStore(None, StoreBudgets(device_bytes=0), "cuda")  # no device tier: every read copies from host
    rag = FusionRAG.from_pretrained("tiny", device="cuda", dtype=dtype, store=store,
                                    options={"prefix_cache": False, "layerwise_load": layerwise})  # fmt: skip
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    return rag


def test_on_by_default_on_cuda_and_the_host_tier_is_pinned():
    rag = cuda_engine(None, "float32")
    assert rag.engine.kv.layerwise is True
    host = [tier for tier in rag.store._memory if tier.name == "host"][0]
    assert host.pin and all(host.get(key).keys.is_pinned() for key in host.keys())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layer_by_layer_on_a_stream_gives_the_same_logits(dtype):
    whole, layerwise = cuda_engine(False, dtype), cuda_engine(True, dtype)
    for method, ratio in METHODS:
        a = whole.generate(REQUEST, method=method, recompute_ratio=ratio, max_new_tokens=4)
        b = layerwise.generate(REQUEST, method=method, recompute_ratio=ratio, max_new_tokens=4)
        assert a.token_ids == b.token_ids, method
        la = whole.logits(REQUEST, a.token_ids, method=method, recompute_ratio=ratio)
        lb = layerwise.logits(REQUEST, a.token_ids, method=method, recompute_ratio=ratio)
        torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-5, msg=method)


def test_a_slow_copy_stream_is_waited_for_layer_by_layer(monkeypatch):
    """Each layer group's copies start after the copy stream spins for milliseconds: the forward must
    wait for each group (one that read a layer early would read a staging buffer not yet written)."""
    whole, layerwise = cuda_engine(False, "float32"), cuda_engine(True, "float32")
    expected = whole.logits(REQUEST, [5, 6], method="fusionrag", recompute_ratio=0.15)
    streams, stage = [], LayerFeed._stage

    def slow(self, start, end, stream):
        streams.append(stream)
        if stream is not None:
            with torch.cuda.stream(stream):
                torch.cuda._sleep(20_000_000)
        return stage(self, start, end, stream)

    monkeypatch.setattr(LayerFeed, "_stage", slow)
    got = layerwise.logits(REQUEST, [5, 6], method="fusionrag", recompute_ratio=0.15)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert streams and all(stream is not None for stream in streams)  # entries in host memory: copied
