"""variant_policy: a chunk's fused entry serves a request only when its fusion neighbours are there."""

import pytest

from fusionrag_llm import FusionRAG, FusionRAGError, RAGRequest
from fusionrag_llm.engine.methods import check_run_options
from fusionrag_llm.eval.bench_methods import parse_method

TEXTS = ["Anna keeps the lighthouse on Skerry.", "Anna's lighthouse was built in 1890.",
         "Carl runs the ferry to Holm.", "Carl's ferry leaves at nine."]  # fmt: skip


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    # neighbours: 0 <-> 1 and 2 <-> 3
    rag.add_chunks(TEXTS, embeddings=[[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], neighbors=1)
    return rag


def test_overlap_keeps_fused_entries_whose_neighbours_are_present_and_declines_the_rest(rag):
    # chunk 0 follows S0 (its plain entry is exact); chunk 1 was fused after chunk 0 (present);
    # chunk 2 was fused after chunk 3 (absent)
    request = RAGRequest(chunks=TEXTS[:3], question="Who keeps the lighthouse?")
    paper = rag.generate(request, method="fusionrag", recompute_ratio=0.0, max_new_tokens=2)
    chosen = rag.generate(request, method="fusionrag", recompute_ratio=0.0, max_new_tokens=2, variant_policy="overlap")
    assert paper.stats.variant_hits == {"fused": 2, "plain": 0} and paper.stats.fused_declined == 0
    assert chosen.stats.variant_hits == {"fused": 1, "plain": 1} and chosen.stats.fused_declined == 1
    together = TEXTS[:2] + TEXTS[2:]  # every neighbour present: nothing declined
    full = rag.generate(RAGRequest(chunks=together, question="Who?"), method="fusionrag", recompute_ratio=0.0,
                        max_new_tokens=2, variant_policy="overlap")  # fmt: skip
    assert full.stats.variant_hits == {"fused": 3, "plain": 0} and full.stats.fused_declined == 0


def test_logits_follow_the_policy(rag):
    request = RAGRequest(chunks=[TEXTS[0], TEXTS[2]], question="Who runs the ferry?")  # chunk 2's neighbour absent
    plain = rag.logits(request, [5, 6], method="fusionrag", recompute_ratio=0.0, kv_variant="plain")
    chosen = rag.logits(request, [5, 6], method="fusionrag", recompute_ratio=0.0, variant_policy="overlap")
    paper = rag.logits(request, [5, 6], method="fusionrag", recompute_ratio=0.0)
    assert (chosen - plain).abs().max() < 1e-5 < (paper - plain).abs().max()


@pytest.mark.parametrize("knobs, message", [
    (dict(method="fusionrag", variant_policy="sometimes"), "valid: always, overlap"),
    (dict(method="full_reuse", variant_policy="overlap"), "needs kv_variant 'fused'"),
    (dict(method="fusionrag", kv_variant="plain", variant_policy="overlap"), "needs kv_variant 'fused'"),
])  # fmt: skip
def test_the_validator_names_a_bad_policy(knobs, message):
    with pytest.raises(FusionRAGError, match=message):
        check_run_options(recompute_ratio=0.15, **knobs)
    assert check_run_options(method="full_reuse", recompute_ratio=0, variant_policy="always").variant_policy == "always"


def test_benchmarks_spell_a_policy_after_a_colon():
    method = parse_method("fusionrag:overlap")
    assert (method.label, method.method, method.variant_policy) == ("fusionrag:overlap", "fusionrag", "overlap")
    assert parse_method("fused+kv_deviation:overlap").selector == "kv_deviation"
    with pytest.raises(ValueError, match="variant policy"):
        parse_method("fusionrag:never")

