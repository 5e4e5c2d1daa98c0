"""Which of a chunk's stored variants serves a request (a method's ``chunk_kv``): "fused" (the paper,
``fusionrag_paper``) serves the fused entry; "blend" (``fusionrag``) the mean of the fused and plain
KV, except for a chunk right after its own neighbours, whose fused entry serves alone
(``stats.method_stats["fused_in_context"]``)."""

import torch

from fusionrag_llm import FusionRAG, RAGRequest, get_method
from fusionrag_llm.engine.blend import BLEND
from fusionrag_llm.storage import KVEntry

TEXTS = ["Anna keeps the lighthouse on Skerry.", "Anna's lighthouse was built in 1890.",
         "Carl runs the ferry to Holm.", "Carl's ferry leaves at nine."]  # fmt: skip
# the blend alone: fusionrag without its KV shift (at r = 0 nothing is recomputed, so nothing shifts anyway)
BLENDED = get_method("fusionrag", kv_shift=0.0)


def test_the_methods_name_the_variant_that_serves_their_chunks():
    assert {name: get_method(name).chunk_kv for name in ("fusionrag", "fusionrag_paper", "cache_craft", "cacheblend",
                                                          "full_attention")} == {  # fmt: skip
        "fusionrag": "blend", "fusionrag_paper": "fused", "cache_craft": "cfo", "cacheblend": "plain",
        "full_attention": None}


def test_the_paper_serves_every_fused_entry_it_finds_and_plain_methods_none():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(TEXTS, embeddings=[[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], neighbors=1)
    request = RAGRequest(chunks=TEXTS[:3], question="Who keeps the lighthouse?")  # the first chunk: exact plain
    paper = rag.generate(request, method="fusionrag_paper", recompute_ratio=0.0, max_new_tokens=2)
    assert paper.stats.variant_hits == {"fused": 2, "plain": 0} and paper.stats.method_stats == {}
    plain = rag.generate(request, method="cacheblend", recompute_ratio=0.0, max_new_tokens=2)
    assert plain.stats.variant_hits == {"fused": 0, "plain": 2}


def _stored(rag, token_ids):
    """The stored entries of a chunk, by variant."""
    found = {}
    for key in rag.store.keys():
        entry = rag.store.get(key, copy=False)[0]
        if entry.token_ids == tuple(token_ids) and entry.meta.get("variant") in ("fused", "plain"):
            found[entry.meta["variant"]] = entry
    return found


def _second_chunk_exact(rag, request):
    """The request's second chunk segment, the prompt's exact (rotary-free) KV, and that chunk's span in it."""
    segments = rag.segments(request)
    ids = [token for segment in segments for token in segment.token_ids]
    second = [s for s in segments if s.kind == "chunk"][1]
    start = sum(len(s.token_ids) for s in segments[: segments.index(second)])
    exact = rag.engine.computer.compute_exact(tuple(ids))
    return second, exact, slice(start, start + len(second.token_ids))


def _spoil(rag, variant, layers):
    """Add 50 to the keys of every stored entry of ``variant`` at ``layers``."""
    for key in rag.store.keys():
        entry = rag.store.get(key)[0]
        if entry.meta.get("variant") == variant:
            keys = entry.keys.clone()
            keys[layers] += 50.0
            rag.store.put(key, KVEntry(entry.token_ids, keys, entry.values, entry.meta))


def _spoiled_rag(layers):
    """A fresh engine over TEXTS whose fused entries' keys are 50 off at ``layers``."""
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(TEXTS, embeddings=[[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], neighbors=1)
    _spoil(rag, "fused", layers)
    return rag


def test_blend_serves_the_mean_of_the_fused_and_plain_kv():
    """Chunk 1's fused entry is replaced by 2 x (its exact KV in this prompt) - its plain entry: the blend
    of the two at BLEND = 0.5 is the exact KV, so the run at r = 0 equals Full Attention."""
    assert BLEND == 0.5
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(TEXTS, embeddings=[[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], neighbors=1)
    request = RAGRequest(chunks=[TEXTS[3], TEXTS[1]], question="Who keeps the lighthouse?")  # 1's neighbour absent
    second, exact, span = _second_chunk_exact(rag, request)
    plain = _stored(rag, second.token_ids)["plain"]
    for key in rag.store.keys():
        entry = rag.store.get(key)[0]
        if entry.token_ids == tuple(second.token_ids) and entry.meta.get("variant") == "fused":
            keys, values = 2 * exact.keys[:, :, span] - plain.keys, 2 * exact.values[:, :, span] - plain.values
            rag.store.put(key, KVEntry(entry.token_ids, keys, values, entry.meta))
    targets = [5, 6]
    full = rag.logits(request, targets, method="full_attention")
    blended = rag.logits(request, targets, method=BLENDED, recompute_ratio=0.0)
    assert (blended - full).abs().max() < 1e-4
    assert torch.equal(rag.logits(request, targets, method="fusionrag", recompute_ratio=0.0), blended)  # no shift at r = 0
    fused = rag.logits(request, targets, method="fusionrag_paper", recompute_ratio=0.0)
    assert (fused - full).abs().max() > 1e-2  # the fused entry alone is far off
    out = rag.generate(request, method=BLENDED, recompute_ratio=0.0, max_new_tokens=2)
    assert out.stats.variant_hits == {"fused": 1, "plain": 0}  # a blended chunk counts as a fused hit
    assert "fused_in_context" not in out.stats.method_stats


def test_a_chunk_after_its_own_neighbours_is_served_from_its_fused_entry_alone():
    """Fused entries spoiled at every layer (the blend would move away from them): chunk 1 right after
    its neighbour 0 still gets its fused entry alone, exactly as under the paper's choice."""
    layers = FusionRAG.from_pretrained("tiny", store=":memory:").engine.model.cfg.num_layers
    rag = _spoiled_rag(slice(0, layers))
    request = RAGRequest(chunks=TEXTS[:2], question="Who keeps the lighthouse?")
    out = rag.generate(request, method=BLENDED, recompute_ratio=0.0, max_new_tokens=2)
    assert out.stats.variant_hits == {"fused": 1, "plain": 0} and out.stats.method_stats == {"fused_in_context": 1}
    targets = [5, 6]
    assert torch.equal(rag.logits(request, targets, method=BLENDED, recompute_ratio=0.0),
                       rag.logits(request, targets, method="fusionrag_paper", recompute_ratio=0.0))
    apart = RAGRequest(chunks=[TEXTS[3], TEXTS[1]], question="Who keeps the lighthouse?")  # its neighbour absent
    assert not torch.equal(rag.logits(apart, targets, method=BLENDED, recompute_ratio=0.0),
                           rag.logits(apart, targets, method="fusionrag_paper", recompute_ratio=0.0))


ORDERED = ["Ada builds the bridge.", "Ben paints the bridge.", "Cy crosses the bridge."]


def test_the_neighbours_must_be_ahead_in_the_order_they_were_placed():
    """Chunk 2's neighbours, most similar first (the paper's layout): 0 then 1."""
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(ORDERED, embeddings=[[1, 0], [0.6, 0.8], [0.95, 0.31]], neighbors=2)

    def served(order):
        request = RAGRequest(chunks=[ORDERED[i] for i in order], question="Who?")
        return rag.generate(request, method=BLENDED, recompute_ratio=0.0, max_new_tokens=1).stats.method_stats

    assert served([0, 1, 2]).get("fused_in_context") == 1  # chunk 2 (chunk 1's neighbours include the absent chunk 2)
    assert served([1, 0, 2]).get("fused_in_context", 0) == 0
