"""Cache-Craft's request-made chunk variants (``craft_variants``, ``fusion/request_variants.py``) on
``tiny``: a chunk served after a new prefix is stored as the request computed it, keyed by that
prefix, with notes measured from its own attention; the next request with the same prefix reads it
with nothing to fix; the least reused are dropped over the budget; other processes see them."""

import json
import math

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.fusion.craft import VariantNotes
from fusionrag_llm.fusion.request_variants import VARIANT_LOG
from fusionrag_llm.models.forward import ForwardPass
from method_spy import spy

from test_cache_craft import A, C, D, E, EMBEDDINGS, QUESTION


def engine(store=":memory:", craft_variants=5):
    rag = FusionRAG.from_pretrained("tiny", store=store,
                                    options={"prefix_cache": False, "craft_variants": craft_variants})
    rag.add_chunks(list(EMBEDDINGS), embeddings=list(EMBEDDINGS.values()), neighbors=2, variant_notes=True)
    return rag


def ask(rag, chunks, ratio):
    return rag.generate(RAGRequest(chunks=chunks, question=QUESTION), "cache_craft", ratio, max_new_tokens=2)


def made(out) -> int:
    """The request-made variants a run stored (Cache-Craft's ``variants_made``; 0 when it kept none)."""
    return out.stats.method_stats.get("variants_made", 0)


def variant(rag, text, prefix):
    """The request-made variant of ``text`` after the chunks ``prefix``, read from the engine's entry store."""
    engine, ids = rag.engine, rag.tokenizer.encode(text)
    key = engine.keys.request_key(ids, [chunk_id_of(t) for t in prefix])
    found = engine.entry_store.fetch(key, ids, "request")
    return None if found is None else found[0]


def exact_forward(rag, chunks):
    """The whole prompt computed at once: its raw K/V, its queries at every layer, the chunks' slots."""
    segments = rag.segments(RAGRequest(chunks=chunks, question=QUESTION))
    ids = [t for s in segments for t in s.token_ids]
    model = rag.engine.model
    cache = model.new_cache(len(ids))
    slots = cache.reserve(len(ids))
    out = model(ForwardPass(torch.tensor(ids), torch.arange(len(ids)), slots, logit_rows=slots[-1:], capture_raw_kv=True,
                            capture_query_layers=frozenset(range(model.cfg.num_layers))), cache)  # fmt: skip
    spans, start = [], 0
    for s in segments:
        if s.kind == "chunk":
            spans.append((start, start + len(s.token_ids)))
        start += len(s.token_ids)
    return out, cache, spans


def test_a_chunk_after_a_new_prefix_is_stored_as_the_request_computed_it():
    rag = engine()
    out = ask(rag, [D, E, C], 1.0)
    # D is first after the prefix (exact plain), E and C come after prefixes no variant was made after
    assert made(out) == 2
    assert variant(rag, C, [D, E]) is not None and variant(rag, E, [D]) is not None
    assert variant(rag, C, [E, D]) is None  # the prefix's order is part of the key
    exact, _, spans = exact_forward(rag, [D, E, C])
    entry = variant(rag, C, [D, E])
    start, end = spans[2]
    # r = 1: the stored variant is the prompt's exact KV, keys back to position-free
    torch.testing.assert_close(entry.keys, exact.raw_keys[:, :, start:end], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(entry.values, exact.raw_values[:, :, start:end], atol=2e-5, rtol=1e-4)
    assert entry.meta["prefix"] == [chunk_id_of(D), chunk_id_of(E)]
    # the same request again makes none: its chunks' prefixes are known now
    assert made(ask(rag, [D, E, C], 1.0)) == 0


def test_a_request_variant_keeps_notes_measured_from_its_own_attention():
    """At r = 1 every row of the chunk is computed: the notes equal the softmax of the prompt's queries."""
    rag = engine()
    ask(rag, [D, E, C], 1.0)
    entry = variant(rag, C, [D, E])
    notes = VariantNotes.from_meta(entry.meta, entry.meta["prefix"], len(entry.token_ids))
    exact, cache, spans = exact_forward(rag, [D, E, C])
    (start, end), prefix = spans[2], spans[:2]
    n, a, b, inter, outside = end - start, [], [], [0.0, 0.0], torch.zeros(end - start, dtype=torch.float64)
    for layer in range(rag.engine.model.cfg.num_layers):
        q = exact.queries[layer][:, start:end].float()
        k = cache.keys[layer, :, :end].float().repeat_interleave(q.shape[0] // cache.keys.shape[1], dim=0)
        causal = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
        w = torch.softmax((q @ k.transpose(1, 2) / q.shape[-1] ** 0.5).masked_fill(~causal, float("-inf")), -1).mean(0)
        per = [float(w[:, s:e].sum()) for s, e in prefix]
        inter = [x + y for x, y in zip(inter, per)]
        a.append(sum(p / (n * (e - s)) for p, (s, e) in zip(per, prefix)))
        b.append(float(w[:, start:end].sum()) / n**2)
        outside += sum(w[:, s:e].sum(dim=1) for s, e in prefix).double()
    assert notes.cci == pytest.approx(1 / (1 + math.exp(-(sum(a) / len(a)) / (sum(b) / len(b)))), abs=1e-4)
    assert list(notes.inter) == pytest.approx(inter, abs=1e-4)
    assert list(notes.order[:3]) == torch.argsort(outside, descending=True)[:3].tolist()


def test_the_next_request_after_the_same_prefix_reads_it_with_nothing_to_fix():
    rag = engine()
    ask(rag, [D, E, C], 1.0)
    request = RAGRequest(chunks=[D, E, C], question=QUESTION)
    out = ask(rag, [D, E, C], 0.15)
    assert out.stats.variant_hits.get("request") == 2 and made(out) == 0
    method, seen = spy("cache_craft")
    rag.generate(request, method, 0.15, max_new_tokens=1)
    assert seen[0].layout.chunk_fix[1:] == (0.0, 0.0)
    # exact variants: the answer's logits are Full Attention's
    ids = list(out.token_ids)
    torch.testing.assert_close(rag.logits(request, ids, "cache_craft", 0.15), rag.logits(request, ids, "full_attention"),
                               atol=1e-4, rtol=1e-4)  # fmt: skip


def test_variants_made_at_a_low_ratio_serve_and_shared_entries_never_change():
    rag = engine()
    before = {t: found.entry for t in (C, E) for v in ("plain", "fused")
              if (found := rag.stored(rag.tokenizer.encode(t), v)) is not None}  # fmt: skip
    before = {t: (e.keys.clone(), e.values.clone()) for t, e in before.items()}
    first = ask(rag, [D, E, C], 0.15)
    assert made(first) == 2
    again = ask(rag, [D, E, C], 0.15)
    assert again.stats.variant_hits.get("request") == 2
    for text, (keys, values) in before.items():
        ids = rag.tokenizer.encode(text)
        stored = [found.entry for v in ("plain", "fused") if (found := rag.stored(ids, v)) is not None]
        assert any(torch.equal(e.keys, keys) and torch.equal(e.values, values) for e in stored)


def test_the_least_reused_variant_is_dropped_over_the_budget():
    rag = engine(craft_variants=2)  # C is the only chunk with variants: at most 2 of them
    ask(rag, [D, C], 0.3)
    assert ask(rag, [D, C], 0.3).stats.variant_hits.get("request") == 1  # C after D read once: fr > 0
    ask(rag, [E, C], 0.3)
    assert variant(rag, C, [D]) is not None and variant(rag, C, [E]) is not None
    ask(rag, [A, C], 0.3)  # a third: the never-read one (after E) goes, entry and listing
    assert variant(rag, C, [E]) is None
    assert variant(rag, C, [D]) is not None and variant(rag, C, [A]) is not None
    assert {tuple(v.prefix) for v in rag.engine.variants.of(chunk_id_of(C))} == {(chunk_id_of(D),), (chunk_id_of(A),)}


def test_another_process_on_the_store_reads_the_variants(tmp_path):
    first = engine(tmp_path / "store")
    ask(first, [D, E, C], 1.0)
    lines = [json.loads(line) for line in (tmp_path / "store" / VARIANT_LOG).read_text().splitlines()]
    assert {tuple(line["prefix"]) for line in lines} == {(chunk_id_of(D),), (chunk_id_of(D), chunk_id_of(E))}
    other = FusionRAG.from_pretrained("tiny", store=tmp_path / "store",
                                      options={"prefix_cache": False, "craft_variants": 5})
    out = ask(other, [D, E, C], 0.15)
    assert out.stats.variant_hits.get("request") == 2 and made(out) == 0


def test_variants_are_off_by_default_and_bad_values_are_refused(tmp_path):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path / "store", options={"prefix_cache": False})
    rag.add_chunks(list(EMBEDDINGS), embeddings=list(EMBEDDINGS.values()), neighbors=2, variant_notes=True)
    assert made(ask(rag, [D, E, C], 0.3)) == 0
    assert not (tmp_path / "store" / VARIANT_LOG).exists()
    for bad in (-1, True, 1.5, "5"):
        with pytest.raises(FusionRAGError, match="craft_variants must be an int >= 0"):
            FusionRAG.from_pretrained("tiny", store=":memory:", options={"craft_variants": bad})


def test_other_methods_make_no_variants():
    rag = engine()
    for method in ("fusionrag", "full_reuse", "cacheblend"):
        out = rag.generate(RAGRequest(chunks=[D, E, C], question=QUESTION), method, 0.3, max_new_tokens=2)
        assert "variants_made" not in out.stats.method_stats
    assert len(rag.engine.variants) == 0


def test_a_damaged_listing_line_is_skipped(tmp_path):
    rag = engine(tmp_path / "store")
    ask(rag, [D, E, C], 0.3)
    log = tmp_path / "store" / VARIANT_LOG
    log.write_bytes(log.read_bytes() + b'{"variant": "x", "model": "' + rag.fingerprint.encode()
                    + b'", "chunk": "c", "prefix": ["a"], "inter": [], "cci": 2}\nnot json\n')  # fmt: skip
    other = FusionRAG.from_pretrained("tiny", store=tmp_path / "store",
                                      options={"prefix_cache": False, "craft_variants": 5})
    assert ask(other, [D, E, C], 0.3).stats.variant_hits.get("request") == 2
    assert len(other.engine.variants) == 2


def test_a_batch_makes_each_request_s_variants_and_answers_as_one_by_one():
    batch_rag, single_rag = engine(), engine()
    requests = [RAGRequest(chunks=[D, E, C], question=QUESTION), RAGRequest(chunks=[E, D, C], question=QUESTION)]
    together = batch_rag.generate_many(requests, "cache_craft", 0.3, max_new_tokens=3)
    alone = [single_rag.generate(r, "cache_craft", 0.3, max_new_tokens=3) for r in requests]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert [made(g) for g in together] == [2, 2]
    assert len(batch_rag.engine.variants) == len(single_rag.engine.variants) == 4


def test_cfo_reads_a_variant_whose_prefix_chunks_are_all_in_front():
    rag = engine()
    ask(rag, [D, E, C], 0.3)  # variants E after (D), C after (D, E)
    out = ask(rag, [A, D, E, C], 0.3)
    # C after (A, D, E): its (D, E) variant has beta' = 1, CFO 0 (E after (A, D) likewise); every
    # prefix here is new, so the run stores D, E and C after them
    assert (out.stats.variant_hits.get("request", 0), made(out)) == (2, 3)
