"""fused_order: how a fused entry's neighbours are laid out before its chunk; each layout is stitched
as promised, is its own entry (key, meta, catalog record), and the default is the paper's, unchanged."""

import json

import pytest
import torch

from fusionrag_llm import FusionRAG, FusionRAGError, RAGRequest
from fusionrag_llm.fusion.catalog import FusedRecord
from fusionrag_llm.fusion.entry_keys import EntryKeys
from fusionrag_llm.fusion.fused_order import FUSED_ORDERS, context_in_place, placement_order
from fusionrag_llm.fusion.placement import place_entry
from fusionrag_llm.models.llama import ForwardPass
from fusionrag_llm.storage import KVEntry, chunk_key

TEXTS = ["Anna keeps the lighthouse on Skerry.", "Anna's lighthouse was built in 1890.",
         "Carl runs the ferry to Holm.", "Carl's ferry leaves at nine."]  # fmt: skip
# chunk 0's neighbours, most similar first: 2 (0.95), 3 (0.8), 1 (0.5); registered in the order 1, 2, 3
EMBEDDINGS = [[1, 0], [0.5, 0.87], [0.95, 0.31], [0.8, 0.6]]
PLACED = {"similar_first": [2, 3, 1], "similar_last": [1, 3, 2], "corpus": [1, 2, 3]}


def _rag(fused_order=None, neighbors=3):
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    rag.add_chunks(TEXTS, embeddings=EMBEDDINGS, neighbors=neighbors, fused_order=fused_order)
    return rag


@pytest.fixture(scope="module")
def rags():
    return {order: _rag(order) for order in FUSED_ORDERS}


def _ids(rag, index):
    return rag.parts.catalog.get(TEXTS[index]).token_ids


def _stitched_by_hand(rag, chunk, neighbours):
    """The chunk's KV run after S0 and ``neighbours``' plain entries, placed at consecutive positions."""
    model, entries = rag.parts.loaded.model, rag.parts.entries
    s0 = entries.computer.compute_exact(entries.s0_ids)
    plain = [entries.lookup(_ids(rag, n), "plain")[0] for n in neighbours]
    ids = torch.tensor(_ids(rag, chunk))
    context = len(s0.token_ids) + sum(len(p.token_ids) for p in plain)
    cache = model.new_cache(context + len(ids))
    position = 0
    for entry in [s0, *plain]:
        place_entry(model, cache, entry, position)
        position += len(entry.token_ids)
    step = ForwardPass(ids, torch.arange(context, context + len(ids)), cache.reserve(len(ids)), logit_rows=ids[:0],
                       capture_raw_kv=True)  # fmt: skip
    out = model(step, cache)
    return out.raw_keys, out.raw_values


@pytest.mark.parametrize("fused_order", FUSED_ORDERS)
def test_each_layout_places_the_neighbours_in_its_promised_order(rags, fused_order):
    rag = rags[fused_order]
    fused, _ = rag.parts.entries.lookup(_ids(rag, 0), "fused")
    keys, values = _stitched_by_hand(rag, 0, PLACED[fused_order])
    assert torch.allclose(fused.keys, keys, atol=1e-5) and torch.allclose(fused.values, values, atol=1e-5)
    others = [order for order in FUSED_ORDERS if order != fused_order]
    for other in others:  # and not in another layout's order
        keys, _ = _stitched_by_hand(rag, 0, PLACED[other])
        assert (fused.keys - keys).abs().max() > 1e-3
    catalog = rag.parts.catalog
    assert fused.meta["fused_order"] == fused_order
    assert fused.meta["neighbours"] == [catalog.get(TEXTS[n]).chunk_id for n in (2, 3, 1)]  # most similar first
    record = catalog.fused_record(rag.parts.entries.key(_ids(rag, 0), "fused"))
    assert record.fused_order == fused_order and record.requested == tuple(fused.meta["neighbours"])


def test_similar_last_with_one_neighbour_equals_a_plain_forward_pass_over_s0_neighbour_chunk():
    rag = _rag("similar_last", neighbors=1)  # chunk 0's one neighbour is chunk 2
    fused, _ = rag.parts.entries.lookup(_ids(rag, 0), "fused")
    whole = rag.parts.entries.computer.compute_exact(rag.parts.entries.s0_ids + _ids(rag, 2) + _ids(rag, 0))
    n = len(_ids(rag, 0))
    assert torch.allclose(fused.keys, whole.keys[:, :, -n:], atol=1e-5)
    assert torch.allclose(fused.values, whole.values[:, :, -n:], atol=1e-5)


def test_placement_order():
    rows = [7, 2, 5]  # the neighbours' registration rows, most similar first
    assert placement_order("similar_first", rows) == [0, 1, 2]
    assert placement_order("similar_last", rows) == [2, 1, 0]
    assert placement_order("corpus", rows) == [1, 2, 0]
    assert placement_order("similar_last", []) == []


def test_the_default_is_the_papers_layout_under_the_keys_it_always_had(rags):
    assert _rag().parts.entries.fused_order == "similar_first"
    keys = EntryKeys("ab" * 32, s0_ids=(1, 2), lossless=True)
    assert keys.key((7, 8), "fused") == chunk_key("ab" * 32, (1, 2), (7, 8), "fused")  # as before layouts
    assert keys.with_fused_order("similar_last").key((7, 8), "fused") != keys.key((7, 8), "fused")
    assert keys.with_fused_order("similar_last").key((7, 8), "plain") == keys.key((7, 8), "plain")
    # an entry written before layouts existed names none: the default's, and no other layout's
    old = KVEntry((7, 8), torch.zeros(1, 1, 2, 1), torch.zeros(1, 1, 2, 1), {"variant": "fused", "model": "ab" * 32})
    assert keys.accepts(old, "k", "fused") and not keys.with_fused_order("corpus").accepts(old, "k", "fused")
    record = json.loads(FusedRecord("k", "c", 1, ("n",), ("n",), 2, 0.5).to_json())
    del record["fused_order"]  # a record written before layouts existed
    assert FusedRecord.from_json(record).fused_order == "similar_first"


def test_layouts_are_stored_under_different_keys_and_never_serve_each_other():
    rag = _rag()  # the default layout
    entries, ids = rag.parts.entries, _ids(rag, 0)
    first_key, first = entries.key(ids, "fused"), entries.lookup(ids, "fused")[0]
    report = rag.ingest(TEXTS, embeddings=EMBEDDINGS, neighbors=3, fused_order="similar_last")
    assert (report.plain_computed, report.fused_computed) == (0, 4)  # plain entries are shared
    last_key, last = entries.key(ids, "fused"), entries.lookup(ids, "fused")[0]
    assert first_key != last_key and first_key in rag.store and last_key in rag.store
    assert not first.bitwise_equal(last)
    request = RAGRequest(chunks=TEXTS, question="Who keeps the lighthouse?")
    served = rag.generate(request, method="fusionrag", recompute_ratio=0.0, max_new_tokens=1)
    assert served.stats.variant_hits == {"fused": 3, "plain": 0}  # the engine reads the layout it ingested
    # the layouts' catalog records are apart too: back to the default, everything is current
    again = rag.ingest(TEXTS, embeddings=EMBEDDINGS, neighbors=3, fused_order="similar_first")
    assert (again.plain_computed, again.fused_computed) == (0, 0)
    assert entries.lookup(ids, "fused")[0].bitwise_equal(first)
    assert not EntryKeys(entries.fingerprint, entries.s0_ids, True, "corpus").accepts(first, first_key, "fused")


def test_a_bad_layout_names_the_allowed_ones():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:")
    for bad in ("reversed", ["similar_last"], 3):
        with pytest.raises(FusionRAGError, match="similar_first, similar_last, corpus"):
            rag.add_chunks(TEXTS, embeddings=EMBEDDINGS, fused_order=bad)
    assert len(rag.parts.catalog) == 0  # nothing registered
    with pytest.raises(ValueError, match="similar_first, similar_last, corpus"):
        EntryKeys("ab" * 32, s0_ids=(1,), lossless=True, fused_order="random")


def test_another_process_reads_the_layout_the_store_was_ingested_with(tmp_path):
    """A store ingested with similar_last serves its fused entries to an engine opened with
    fused_order="similar_last" or with none (it adopts the one layout its catalog records); an
    engine told another layout finds no fused entry of it and reads the plain ones."""
    writer = FusionRAG.from_pretrained("tiny", store=str(tmp_path))
    writer.add_chunks(TEXTS, embeddings=EMBEDDINGS, neighbors=2, fused_order="similar_last")
    request = RAGRequest(chunks=[TEXTS[2], TEXTS[0], TEXTS[1]], question="Who keeps the lighthouse?")
    reader = FusionRAG.from_pretrained("tiny", store=str(tmp_path), fused_order="similar_last")
    assert reader.generate(request, max_new_tokens=2).stats.variant_hits["fused"] == 2
    untold = FusionRAG.from_pretrained("tiny", store=str(tmp_path))
    assert untold.parts.entries.fused_order == "similar_last"
    assert untold.generate(request, max_new_tokens=2).stats.variant_hits["fused"] == 2
    other = FusionRAG.from_pretrained("tiny", store=str(tmp_path), fused_order="corpus")
    stats = other.generate(request, max_new_tokens=2).stats
    assert stats.variant_hits == {"fused": 0, "plain": 3}  # a bf16 store: the first chunk is reused too (plain)
    with pytest.raises(FusionRAGError, match="similar_first"):
        FusionRAG.from_pretrained("tiny", store=str(tmp_path), fused_order="sideways")


@pytest.mark.parametrize("layout, ahead, expected", [
    ("similar_first", ["a", "b"], True),
    ("similar_first", ["a", "x", "b", "y"], True),  # other chunks between them
    ("similar_first", ["b", "a"], False),
    ("similar_first", ["a"], False),  # one missing
    ("similar_last", ["b", "a"], True),
    ("similar_last", ["a", "b"], False),
    ("corpus", ["b", "a"], True),  # its order is the catalog's: only presence is checked
    ("corpus", ["b"], False),
])  # fmt: skip
def test_context_in_place_needs_every_neighbour_ahead_in_placement_order(layout, ahead, expected):
    assert context_in_place({"neighbours": ["a", "b"], "fused_order": layout}, ahead) is expected
    assert context_in_place({"neighbours": []}, ahead)  # fused after S0 alone
