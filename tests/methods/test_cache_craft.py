"""Cache-Craft on the one engine: its rules against hand-worked numbers, the notes a fused entry
keeps, the variant whose prefix chunks match, the per-chunk budget and the early stop of unfocused
chunks (on ``tiny``, with hand-built neighbour sets)."""

import json
import math

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest, get_method
from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion import craft
from fusionrag_llm.fusion.catalog import CATALOG_FILE, ChunkCatalog, chunk_id_of
from fusionrag_llm.fusion.craft import (FocusTracker, VariantNotes, adjusted_overlap, chunk_budgets, fix_overhead,
                                        focused_chunks, kendall_distance, plain_notes)  # fmt: skip
from fusionrag_llm.fusion.layout import RequestLayout, ScoringInput
from fusionrag_llm.fusion.placement import place_entry
from fusionrag_llm.methods.base import select_many
from fusionrag_llm.methods.cache_craft import CacheCraft
from fusionrag_llm.models.forward import ForwardPass
from method_spy import spy

A, B, C, D, E = (
    "The lighthouse at Keldmouth was designed by the engineer Tamsin Orrery in 1872.",
    "Tamsin Orrery was born in Brightwater, a city at the mouth of the river Sel.",
    "Brightwater is the capital of Lowmarch, a flat province crossed by canals.",
    "Sheep on the island of Varrow graze the cliffs all year round, even in winter.",
    "The Varrow ferry runs twice a week from the harbour at Calder when the sea is calm.",
)
# C's two nearest are B (closest) then A; D and E are far from all three
EMBEDDINGS = {A: [1.0, 0.5, 0.0], B: [0.8, 0.7, 0.0], C: [0.7, 0.75, 0.0], D: [0.0, 0.1, 1.0], E: [0.1, 0.0, 1.0]}
QUESTION = "Where was the lighthouse designer born?"


def test_kendall_distance_and_adjusted_overlap_follow_the_paper():
    assert kendall_distance(["a", "b", "c"], ["a", "b", "c"]) == 0.0
    assert kendall_distance(["a", "b", "c"], ["c", "b", "a"]) == 1.0
    assert kendall_distance(["a", "b", "c"], ["b", "a", "c"]) == pytest.approx(1 / 3)
    notes = VariantNotes(("a", "b"), (3.0, 1.0), 0.8)
    assert adjusted_overlap(notes, ["a", "b"]) == 1.0 and fix_overhead(notes, ["a", "b"]) == 0.0
    # the paper's C1-C2-C3 against C2-C1-C3: every prefix chunk present (beta 1), but in the other order
    assert adjusted_overlap(notes, ["b", "a"]) == 0.0 and fix_overhead(notes, ["b", "a"]) == pytest.approx(0.8)
    # only "a" is in front now: beta = 3 / (3 + 1), one item has no pair to disagree on
    assert adjusted_overlap(notes, ["x", "a"]) == pytest.approx(0.75)
    assert fix_overhead(notes, ["x", "a"]) == pytest.approx(0.8 * 0.25)
    assert fix_overhead(notes, []) == pytest.approx(0.8)
    assert fix_overhead(notes, ["x", "a"], alpha=10.0) == 1.0  # never more than the whole chunk
    # a plain entry: sigmoid(0) = 0.5 context impact, a perfect match only in front of no chunk
    assert fix_overhead(plain_notes(), []) == 0.0 and fix_overhead(plain_notes(), ["a"]) == 0.5


def test_budgets_follow_overhead_times_length_and_never_exceed_a_chunk():
    assert chunk_budgets([0.5, 0.0, 1.0], [10, 10, 10], 6) == [2, 0, 4]
    assert chunk_budgets([1.0, 0.1], [4, 40], 10) == [4, 6]  # the first is full, the rest goes on
    assert chunk_budgets([0.5, 0.5, 0.5], [10, 10, 10], 4) == [2, 1, 1]  # leftovers: the first largest remainder
    assert chunk_budgets([0.0, 0.0], [3, 9], 4) == [1, 3]  # nothing needs fixing by the rule: by length
    assert chunk_budgets([0.3, 0.6], [5, 5], 0) == [0, 0]
    assert chunk_budgets([0.3, 0.6], [5, 5], 50) == [5, 5]


def test_focused_chunks_are_algorithm_one():
    # sorted 10, 9, 1, 0.5, 0.4: gaps 1, 8, 0.5, 0.1; p = gaps / 9.6; the entropy steps -p log p for
    # i = 1, 2, 3 are 0.152, 0.154, 0.047, so i* = 2: the two chunks that stand out
    p = [g / 9.6 for g in (1, 8, 0.5, 0.1)]
    steps = [-x * math.log(x) for x in p]
    assert max(range(1, 4), key=lambda i: steps[i]) == 2
    assert focused_chunks([1, 9, 0.5, 10, 0.4]) == frozenset({1, 3})
    assert focused_chunks([5, 1, 0.9, 0.8, 0.7]) == frozenset({0})
    assert focused_chunks([3, 1]) == frozenset({0, 1})  # fewer than three chunks: all focused
    assert focused_chunks([2, 2, 2, 2]) == frozenset(range(4))  # no gap at all


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(list(EMBEDDINGS), embeddings=list(EMBEDDINGS.values()), neighbors=2, variant_notes=True)
    return rag


def test_notes_are_stored_only_when_asked_and_added_to_entries_without_them():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    texts, vectors = list(EMBEDDINGS)[:3], list(EMBEDDINGS.values())[:3]
    rag.add_chunks(texts, embeddings=vectors, neighbors=2)
    without = fused_entry(rag, C)
    assert craft.META_KEY not in without.meta
    again = rag.add_chunks(texts, embeddings=vectors, neighbors=2, variant_notes=True)
    assert again.fused_computed == 3 and again.plain_computed == 0  # only the fused entries, once more
    noted = fused_entry(rag, C)
    assert craft.META_KEY in noted.meta and torch.equal(noted.keys, without.keys)  # same KV, notes added
    assert rag.add_chunks(texts, embeddings=vectors, neighbors=2, variant_notes=True).fused_computed == 0
    with pytest.raises(FusionRAGError, match="variant_notes must be True or False"):
        rag.add_chunks(texts, embeddings=vectors, variant_notes="yes")


def fused_entry(rag, text):
    return rag.stored(rag.tokenizer.encode(text), "fused").entry


def test_a_fused_entry_keeps_notes_measured_from_its_own_attention(rag):
    """The stored CCI and per-neighbour attention equal the softmax of the queries that computed it."""
    entry = fused_entry(rag, C)
    assert entry.meta["neighbours"] == [chunk_id_of(B), chunk_id_of(A)]
    notes = VariantNotes.from_meta(entry.meta, entry.meta["neighbours"], len(entry.token_ids))
    assert notes is not None and sorted(notes.order) == list(range(len(entry.token_ids)))

    # recompute as the fused entry was made: S0, then B's and A's plain entries, then C, keeping queries
    model, computer = rag.engine.model, rag.engine.computer
    s0, _ = computer.prefix_entry(computer.keys.s0_ids)
    placed = [s0] + [rag.stored(rag.tokenizer.encode(text), "plain").entry for text in (B, A)]
    start = sum(len(e.token_ids) for e in placed)
    length = start + len(entry.token_ids)
    cache, position, spans = model.new_cache(length), 0, []
    for e in placed:
        place_entry(model, cache, e, position)
        spans.append((position, position + len(e.token_ids)))
        position += len(e.token_ids)
    spans = spans[1:]  # the neighbours' slots
    slots = cache.reserve(len(entry.token_ids))
    out = model(ForwardPass(torch.tensor(entry.token_ids), torch.arange(start, length), slots, logit_rows=slots[:0],
                            capture_query_layers=frozenset(range(model.cfg.num_layers))), cache)  # fmt: skip
    seq = range(length)
    n, a, b, inter = len(entry.token_ids), [], [], [0.0, 0.0]
    for layer in range(model.cfg.num_layers):
        q = out.queries[layer].float()
        k = cache.keys[layer, :, : len(seq)].float().repeat_interleave(q.shape[0] // cache.keys.shape[1], dim=0)
        logits = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
        causal = torch.arange(len(seq))[None, :] <= torch.arange(start, len(seq))[:, None]
        w = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1).mean(dim=0)
        per = [float(w[:, s:e].sum()) for s, e in spans]
        inter = [x + y for x, y in zip(inter, per)]
        a.append(sum(p / (n * (e - s)) for p, (s, e) in zip(per, spans)))
        b.append(float(w[:, start:].sum()) / n**2)
    expected_cci = 1 / (1 + math.exp(-(sum(a) / len(a)) / (sum(b) / len(b))))
    assert notes.cci == pytest.approx(expected_cci, abs=1e-4) and 0.5 < notes.cci < 1
    assert list(notes.inter) == pytest.approx(inter, abs=1e-4)


def assembled(rag, chunks, ratio=0.3):
    """Cache-Craft's run of the question over ``chunks``: its stats and the request layout it saw."""
    method, seen = spy("cache_craft")
    out = rag.generate(RAGRequest(chunks=chunks, question=QUESTION), method=method, recompute_ratio=ratio,
                       max_new_tokens=1)  # fmt: skip
    return out.stats, seen[0].layout


def test_the_variant_whose_prefix_chunks_match_serves_the_chunk(rag):
    # C after its own neighbours in their fused order: beta' = 1, no fix needed, fused entry
    stats, layout = assembled(rag, [D, B, A, C])
    assert layout.chunk_fix[3] == 0.0
    assert stats.variant_hits["fused"] >= 1
    # C after chunks it was not fused with: its fused entry's CFO (its CCI > 0.5) loses to plain's 0.5
    entry = fused_entry(rag, C)
    assert VariantNotes.from_meta(entry.meta, entry.meta["neighbours"], len(entry.token_ids)).cci > 0.5
    stats, layout = assembled(rag, [D, E, C])
    assert layout.chunk_fix[2] == 0.5
    assert stats.method_stats["fused_declined"] >= 1
    # the neighbours present in the other order: beta' = 0 (one discordant pair of one), plain again
    stats, layout = assembled(rag, [A, B, C])
    assert layout.chunk_fix[2] == 0.5
    # notes that do not fit the entry are not read
    assert VariantNotes.from_meta(entry.meta, entry.meta["neighbours"], len(entry.token_ids) + 1) is None
    assert VariantNotes.from_meta({}, [], 3) is None


def test_the_first_chunk_after_the_prefix_is_exact_and_gets_no_budget(rag):
    stats, layout = assembled(rag, [C, D, E])
    assert layout.chunk_fix[0] == 0.0 and stats.path_hits["exact"] == 1


def test_budgets_follow_the_variants_overheads_and_orders():
    spans = ((2, 12), (13, 23), (24, 30))
    reused = torch.cat([torch.arange(s, e) for s, e in spans])
    fresh = torch.tensor([0, 1, 12, 23, 30, 31, 32])
    layout = RequestLayout(torch.zeros(33, dtype=torch.long), reused, fresh, fresh[-3:], spans,
                           chunk_fix=(0.5, 0.0, 1.0), chunk_order=((9, 8, 7, 6, 5, 4, 3, 2, 1, 0), (), ()))  # fmt: skip
    # k = 6 over overhead x length 5, 0, 6: shares 2.73, 0, 3.27 -> 2 + 1 (the larger remainder), 0, 3
    picked = select_many([(get_method("cache_craft"), 6, ScoringInput(None, None, layout, k=6))], None)[0].tolist()
    assert picked == [9, 10, 11, 24, 25, 26]  # chunk 1 by its order (its last tokens), chunk 3 from its start


class EveryOtherToken(CacheCraft):
    """Cache-Craft recomputing every other reused token (its variants, notes and early stop unchanged)."""

    def pick(self, layout, scores, k):
        return layout.reused_slots[::2]


class WithoutEarlyStop(EveryOtherToken):
    def start(self, prefill):
        run = super().start(prefill)
        run.hooks = tuple(hook for hook in run.hooks if not isinstance(hook, FocusTracker))
        return run


def test_unfocused_chunks_stop_being_recomputed_after_the_cutoff(rag, monkeypatch):
    """With a window of one layer the focused set is decided at layer 0: the dropped tokens' KV is
    recomputed at layer 0 and keeps its reused value in every later layer."""
    monkeypatch.setattr(craft, "FOCUS_WINDOW", 1)
    request = RAGRequest(chunks=[D, E, A, B, C], question=QUESTION)

    def prefill(method):
        method, seen = spy(method)
        out = rag.generate(request, method=method, recompute_ratio=0.5, max_new_tokens=1)
        return seen[0], seen[0].placed.keys, seen[0].prefill.cache.keys, out

    seen, before, after, out = prefill(EveryOtherToken())
    tracker = seen.run.tracker
    assert tracker.cutoff == 0 and tracker.focused is not None and len(tracker.focused) < 5
    recompute = seen.prefill.recompute
    dropped, kept = recompute[~tracker.keep], recompute[tracker.keep]
    assert len(dropped) > 0 and tracker.dropped == len(dropped)
    assert out.stats.method_stats["stopped_tokens"] == len(dropped)
    assert torch.equal(after[1:, :, dropped], before[1:, :, dropped])  # later layers: the reused KV
    assert not torch.equal(after[1:, :, kept], before[1:, :, kept])  # the others were recomputed there
    assert len(out.token_ids) == 1
    seen, before, after, out = prefill(WithoutEarlyStop())  # without the early stop the same tokens change
    assert torch.equal(seen.prefill.recompute, recompute) and out.stats.method_stats["stopped_tokens"] == 0
    assert not torch.equal(after[1:, :, dropped], before[1:, :, dropped])


def test_generate_reports_the_early_stop(rag, monkeypatch):
    monkeypatch.setattr(craft, "FOCUS_WINDOW", 1)
    out = rag.generate(RAGRequest(chunks=[D, E, A, B, C], question=QUESTION), method="cache_craft",
                       recompute_ratio=0.5, max_new_tokens=2)  # fmt: skip
    counts = out.stats.method_stats
    assert counts["stop_layer"] == 0 and counts["focused_chunks"] >= 1 and counts["stopped_tokens"] > 0
    exact = rag.generate(RAGRequest(chunks=[D, E, A, B, C], question=QUESTION), method="cache_craft",
                         recompute_ratio=1.0, max_new_tokens=2)  # fmt: skip
    assert "stop_layer" not in exact.stats.method_stats  # r = 1 stays exact: no early stop was tracked


def test_early_stops_in_one_batch_give_the_answers_of_one_by_one(rag, monkeypatch):
    """Two sequences dropping different rows part way through one batched forward."""
    monkeypatch.setattr(craft, "FOCUS_WINDOW", 1)
    requests = [RAGRequest(chunks=[D, E, A, B, C], question=QUESTION),
                RAGRequest(chunks=[E, C, D, A, B], question="What does Lowmarch export?")]  # fmt: skip
    knobs = dict(method="cache_craft", recompute_ratio=0.5, max_new_tokens=3)
    alone = [rag.generate(r, **knobs) for r in requests]
    together = rag.generate_many(requests, **knobs)
    assert all(a.stats.method_stats["stopped_tokens"] > 0 for a in alone)
    assert [t.token_ids for t in together] == [a.token_ids for a in alone]
    assert [t.stats.method_stats for t in together] == [a.stats.method_stats for a in alone]


def test_cache_craft_chooses_its_variant_by_fix_overhead_and_reads_notes():
    method = get_method("cache_craft")
    assert (method.chunk_kv, method.offline_notes, method.selects) == ("cfo", True, True)
    assert all(not get_method(name).offline_notes for name in ("fusionrag", "fusionrag_paper", "cacheblend", "a3"))


def test_benchmarks_store_notes_only_for_methods_that_read_them():
    from fusionrag_llm.eval.bench_data import needs_variant_notes, parse_methods

    assert needs_variant_notes(parse_methods("cache_craft"))
    assert not needs_variant_notes(parse_methods("fusionrag,fusionrag_paper,cacheblend,ape"))


def test_the_cli_ingests_with_notes(tmp_path):
    from click.testing import CliRunner

    from fusionrag_llm.cli.main import cli

    docs = tmp_path / "docs"
    docs.mkdir()
    for i, text in enumerate((A, B, C)):
        (docs / f"{i}.md").write_text(text)
    store = str(tmp_path / "store")
    result = CliRunner().invoke(cli, ["ingest", str(docs), "--model", "tiny", "--store", store, "--neighbors", "1",
                                      "--variant-notes"])  # fmt: skip
    assert result.exit_code == 0, result.output
    rag = FusionRAG.from_pretrained("tiny", store=store)
    assert craft.META_KEY in fused_entry(rag, C).meta


def test_the_catalog_records_which_fused_entries_carry_notes():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    texts, vectors = list(EMBEDDINGS)[:3], list(EMBEDDINGS.values())[:3]
    rag.add_chunks(texts, embeddings=vectors, neighbors=2)
    key = rag.stored(rag.tokenizer.encode(C), "fused").key

    def recorded():  # the record as the store's catalog log holds it, read afresh
        return ChunkCatalog(rag.store.record_log(CATALOG_FILE), rag.tokenizer.encode).fused_record(key)

    assert recorded().notes is False
    rag.add_chunks(texts, embeddings=vectors, neighbors=2, variant_notes=True)
    record = recorded()
    assert record.notes is True
    assert type(record).from_json(json.loads(record.to_json())) == record
