"""Cache-Craft's layer-wise preloading (``fusion/layer_feed.py``): stored KV placed layer by layer as
the forward asks for it gives the same numbers as placing every entry whole before the prefill,
for every method, and no layer is read before it is placed."""

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest, method_names
from fusionrag_llm.fusion.layer_feed import LayerFeed
from fusionrag_llm.fusion.placement import place_entry
from fusionrag_llm.storage import KVEntry
from fusionrag_llm.storage.quantize import SCHEMES, pack
from lighthouse import CHUNKS, EMBEDDINGS, REQUEST

def engine(layerwise: bool, prefix_cache: bool = False) -> FusionRAG:
    rag = FusionRAG.from_pretrained("tiny", device="cpu", store=":memory:",
                                    options={"prefix_cache": prefix_cache, "layerwise_load": layerwise})  # fmt: skip
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    return rag


@pytest.fixture(scope="module")
def pair():
    return engine(False), engine(True)


def random_entry(model, n: int, seed: int) -> KVEntry:
    g = torch.Generator().manual_seed(seed)
    cfg = model.cfg
    shape = (cfg.num_layers, cfg.num_kv_heads, n, cfg.head_dim)
    return KVEntry(tuple(range(1, n + 1)), torch.randn(shape, generator=g), torch.randn(shape, generator=g))


def test_feed_places_a_layer_only_when_asked_and_then_exactly_like_place_entry(pair):
    model = pair[0].engine.model
    entries = [random_entry(model, 5, 0), random_entry(model, 7, 1)]
    whole = model.new_cache(16)
    for entry, start in zip(entries, (3, 20)):
        place_entry(model, whole, entry, start)

    cache = model.new_cache(16)
    feed = LayerFeed(model, cache)
    slots = [feed.place(entry, start) for entry, start in zip(entries, (3, 20))]
    feed.start()
    cache.feed = feed
    assert [s.tolist() for s in slots] == [list(range(5)), list(range(5, 12))]
    assert torch.equal(cache.positions[:12], whole.positions[:12]) and bool(cache.valid[:12].all())
    assert not cache.keys.any() and not cache.values.any()  # nothing placed before it is asked for

    cache.ready(0)
    assert torch.equal(cache.keys[0], whole.keys[0]) and torch.equal(cache.values[0], whole.values[0])
    assert not cache.keys[1:].any()
    cache.settle()
    assert cache.feed is None
    assert torch.equal(cache.keys, whole.keys) and torch.equal(cache.values, whole.values)


def test_a_feed_takes_no_entry_once_started(pair):
    model = pair[0].engine.model
    feed = LayerFeed(model, model.new_cache(8))
    feed.place(random_entry(model, 3, 0), 0)
    feed.start()
    with pytest.raises(RuntimeError, match="before it starts"):
        feed.place(random_entry(model, 3, 1), 3)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_a_packed_entry_is_placed_whole_when_handed_over(pair, scheme):
    model = pair[0].engine.model
    entry = pack(random_entry(model, 40, 2), SCHEMES[scheme])
    whole, cache = model.new_cache(64), model.new_cache(64)
    place_entry(model, whole, random_entry(model, 3, 3), 0)
    place_entry(model, whole, entry, 3)
    feed = LayerFeed(model, cache)
    feed.place(random_entry(model, 3, 3), 0)
    feed.place(entry, 3)
    assert feed.entries == 1  # the packed one is already in, every layer of it
    assert torch.equal(cache.keys[:, :, 3:43], whole.keys[:, :, 3:43])
    feed.start()
    feed.settle()
    assert torch.equal(cache.keys, whole.keys) and torch.equal(cache.values, whole.values)


def test_layer_groups_grow_so_that_the_first_layer_waits_for_one():
    from fusionrag_llm.fusion.layer_feed import layer_groups

    assert layer_groups(1) == [(0, 1)]
    assert layer_groups(30) == [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 30)]
    assert [g for s, e in layer_groups(32) for g in range(s, e)] == list(range(32))


@pytest.mark.parametrize("method", method_names())
def test_every_method_gives_the_same_logits_layer_by_layer(pair, method):
    ratio = 0.3  # a method that selects nothing runs at 0 (full_attention at 1) whatever is asked
    whole, layerwise = pair
    assert not whole.engine.kv.layerwise and layerwise.engine.kv.layerwise
    a = whole.generate(REQUEST, method=method, recompute_ratio=ratio, max_new_tokens=4)
    b = layerwise.generate(REQUEST, method=method, recompute_ratio=ratio, max_new_tokens=4)
    assert a.token_ids == b.token_ids
    assert a.stats.recomputed_tokens == b.stats.recomputed_tokens and a.stats.reused_tokens == b.stats.reused_tokens
    la = whole.logits(REQUEST, a.token_ids, method=method, recompute_ratio=ratio)
    lb = layerwise.logits(REQUEST, a.token_ids, method=method, recompute_ratio=ratio)
    assert torch.equal(la, lb)


def test_a_batch_and_a_stream_load_layer_by_layer_too(pair):
    whole, layerwise = pair
    requests = [RAGRequest(chunks=CHUNKS[i:] + CHUNKS[:i], question=f"Question {i}?") for i in range(3)]
    a = whole.generate_many(requests, method="fusionrag", recompute_ratio=0.3, max_new_tokens=3)
    b = layerwise.generate_many(requests, method="fusionrag", recompute_ratio=0.3, max_new_tokens=3)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    streamed = [piece for piece in layerwise.stream(REQUEST, method="cacheblend", recompute_ratio=0.3, max_new_tokens=3)]
    assert "".join(streamed) == whole.generate(REQUEST, method="cacheblend", recompute_ratio=0.3, max_new_tokens=3).text


def test_exact_path_blocks_are_fed_layer_by_layer():
    """With the prefix cache, the second request reads the first one's exact path blocks: through
    the feed they give the same logits."""
    results = []
    for layerwise in (False, True):
        rag = engine(layerwise, prefix_cache=True)
        rag.generate(REQUEST, method="full_attention", max_new_tokens=1)  # stores the path blocks
        second = rag.generate(REQUEST, method="fusionrag", recompute_ratio=0.15, max_new_tokens=1)
        assert second.stats.path_hits["exact"] > 0
        results.append(rag.logits(REQUEST, [7, 8], method="fusionrag", recompute_ratio=0.15))
    assert torch.equal(*results)


def test_off_by_default_on_the_cpu():
    assert FusionRAG.from_pretrained("tiny", device="cpu", store=":memory:").engine.kv.layerwise is False
