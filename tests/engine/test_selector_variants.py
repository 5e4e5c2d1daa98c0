"""The stronger selectors: several layers, CacheClip's 8-token groups, a share per chunk, a union
with CacheBlend's ranking, two stages (ProphetKV). Each returns k reused slots, batches like query_guided where it reads the
same forward, and follows its own rule."""

import pytest
import torch

from fusionrag_llm import FusionRAG, FusionRAGError, RAGRequest
from fusionrag_llm.engine.methods import plan_run
from fusionrag_llm.engine.variant_choice import entry_spread
from fusionrag_llm.fusion.layout import RequestLayout, ScoringInput
from fusionrag_llm.fusion.scorers import oracle, query_guided, variant_spread
from fusionrag_llm.fusion.scorers.shaping import group_ids, in_groups, per_chunk, rank_union
from fusionrag_llm.fusion.selectors import Selection, select_many, select_tokens

VARIANTS = ["query_guided_layers", "query_guided_groups", "query_guided_per_chunk", "query_guided_kv_union",
            "query_guided_two_stage", "query_guided_spread", "variant_spread"]
CHUNKS = [
    "The river Sel floods the lower town of Brightwater every spring after the snow melts in the hills.",
    "Brightwater's mayor in 1901 was Ida Renn, who built the first stone embankment along the river.",
    "Renn's embankment was rebuilt in 1950 after a storm broke its eastern wall near the old mill.",
]
REQUEST = RAGRequest(chunks=CHUNKS, question="Who built the embankment, and when was it rebuilt?")


def layout(spans, fresh_between=2):
    """Chunks at ``spans`` ([start, end) positions), fresh tokens elsewhere, a 3-token suffix."""
    end = spans[-1][1] + 3
    reused = torch.cat([torch.arange(s, e) for s, e in spans])
    fresh = torch.tensor([p for p in range(end) if not any(s <= p < e for s, e in spans)])
    return RequestLayout(torch.zeros(end, dtype=torch.long), reused, fresh, fresh[-3:], tuple(spans))


def test_groups_are_runs_of_eight_inside_one_chunk():
    lay = layout([(2, 21), (23, 30)])  # 19 and 7 reused tokens
    ids = group_ids(lay).tolist()
    assert ids == [0] * 8 + [1] * 8 + [2] * 3 + [3] * 7
    scores = torch.arange(26, dtype=torch.float32)
    shaped = in_groups(scores, lay)
    assert shaped[:8].unique().tolist() == [3.5] and shaped[19:].unique().tolist() == [22.0]


def test_a_share_per_chunk_takes_the_best_of_every_chunk():
    lay = layout([(2, 12), (14, 34)])  # 10 and 20 reused tokens
    scores = torch.cat([torch.zeros(10), torch.arange(20, dtype=torch.float32) + 100])  # chunk 2 dominates
    top = torch.topk(per_chunk(scores, lay), 6).indices.sort().values.tolist()
    assert top == [0, 1] + [26, 27, 28, 29]  # 20% of each chunk, its highest-scored tokens


def test_the_union_holds_the_top_of_both_rankings():
    first = torch.tensor([9.0, 8, 7, 0, 0, 0, 0, 0])
    second = torch.tensor([0.0, 0, 0, 0, 0, 3, 2, 1])
    assert sorted(torch.topk(rank_union(first, second), 4).indices.tolist()) == [0, 1, 5, 6]


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.8, 0.6], [0.6, 0.8]], neighbors=2)
    return rag


def assembled(rag, selector, variant_policy=None):
    engine = rag.engine
    run = plan_run("fusionrag", 0.2, selector=selector, variant_policy=variant_policy)
    seq = engine._sequence(rag.segments(REQUEST), run, 2)
    work = engine._assemble(seq)
    return Selection(selector, work.k, seq.cache, work.resolved.layout)


@pytest.mark.parametrize("selector", VARIANTS)
def test_each_variant_selects_k_reused_tokens_and_runs_end_to_end(rag, selector):
    job = assembled(rag, selector)
    picked = select_tokens(selector, job.k, rag.engine.model, job.cache, job.layout)
    assert job.k > 0 and len(picked) == job.k and bool(torch.isin(picked, job.layout.reused_slots).all())
    assert picked.tolist() == sorted(set(picked.tolist()))
    out = rag.generate(REQUEST, method="fusionrag", recompute_ratio=0.2, selector=selector, max_new_tokens=2)
    assert out.stats.recomputed_tokens == job.k
    exact = rag.generate(REQUEST, method="full_attention", max_new_tokens=4).token_ids
    assert rag.generate(REQUEST, method="fusionrag", recompute_ratio=1.0, selector=selector, max_new_tokens=4).token_ids == exact


def test_the_attention_oracle_reads_the_question_attention_of_full_attention(rag):
    job = assembled(rag, "oracle_attention")
    model = rag.engine.model
    found = oracle.attention_scores(ScoringInput(model, job.cache, job.layout))
    exact = model.new_cache(job.cache.length)
    slots = exact.reserve(job.cache.length)
    model(job.layout.step(slots, logit_rows=slots[:0]), exact)
    # query_guided_layers over a stitched cache that holds Full Attention's KV reads the same attention
    assert torch.allclose(found, query_guided.layers_scores(ScoringInput(model, exact, job.layout)), rtol=1e-4, atol=1e-7)
    assert not torch.allclose(found, query_guided.layers_scores(ScoringInput(model, job.cache, job.layout)), rtol=1e-2)
    assert found.shape == job.layout.reused_slots.shape


def test_grouped_selection_recomputes_whole_groups(rag):
    job = assembled(rag, "query_guided_groups")
    picked = select_tokens("query_guided_groups", job.k, rag.engine.model, job.cache, job.layout)
    ids = group_ids(job.layout)
    index = torch.searchsorted(job.layout.reused_slots, picked)
    chosen = ids[index]
    whole = [g for g in chosen.unique().tolist() if int((chosen == g).sum()) == int((ids == g).sum())]
    assert len(chosen.unique()) - len(whole) <= 1  # only the last group may be cut by k


def test_the_variants_reading_one_forward_batch_with_query_guided(rag):
    jobs = [assembled(rag, s) for s in ("query_guided", "query_guided_layers", "query_guided_groups", "query_guided_per_chunk")]
    calls = []
    original = rag.engine.model.forward_batch
    rag.engine.model.forward_batch = lambda steps, caches: calls.append(len(steps)) or original(steps, caches)
    try:
        together = select_many(jobs, rag.engine.model)
    finally:
        del rag.engine.model.forward_batch
    assert calls == [4]
    for job, picked in zip(jobs, together):
        assert picked.tolist() == select_tokens(job.selector, job.k, rag.engine.model, job.cache, job.layout).tolist()


def test_two_stages_take_the_first_reading_then_the_reading_after_recomputing_it(rag):
    """Stage one: the top half of k by the upper layers' attention over the stitched cache. Stage two:
    that half and the fresh text recomputed, the question's attention read again, its best others."""
    from fusionrag_llm.fusion.layout import ScoringInput
    from fusionrag_llm.fusion.scorers import query_guided

    job = assembled(rag, "query_guided_two_stage")
    model, lay = rag.engine.model, job.layout
    cache = job.cache
    saved = cache.keys.clone(), cache.values.clone(), cache.valid.clone(), cache.positions.clone()
    first = query_guided.layers_scores(ScoringInput(model, cache, lay))
    half = (job.k + 1) // 2
    stage_one = lay.reused_slots[torch.topk(first, half).indices]
    rows = torch.cat([stage_one, lay.fresh_slots]).sort().values
    layers = frozenset(range(model.cfg.num_layers // 2, model.cfg.num_layers))
    out = model(lay.step(rows, logit_rows=rows[:0], capture_query_layers=layers), cache)
    second = query_guided.layers_scores_from(ScoringInput(model, cache, lay), out, rows)
    assert not torch.allclose(second, first)  # the recomputed half changed what the question attends to
    second[torch.isin(lay.reused_slots, stage_one)] = float("-inf")
    stage_two = lay.reused_slots[torch.topk(second, job.k - half).indices]
    expected = torch.cat([stage_one, stage_two]).sort().values

    cache.keys[:], cache.values[:], cache.valid[:], cache.positions[:] = saved  # the assembled cache again
    picked = select_tokens("query_guided_two_stage", job.k, model, cache, lay)
    assert job.k >= 4 and picked.tolist() == expected.tolist()


def test_spread_weighs_the_attention_by_each_tokens_spread_over_the_mean():
    lay = layout([(2, 6), (8, 12)])  # 8 reused tokens
    lay.variant_spread = torch.full((15,), float("nan"))
    lay.variant_spread[2:6] = torch.tensor([1.0, 3.0, 0.0, 4.0])  # the second chunk was not blended
    scores = torch.full((8,), 2.0)
    assert variant_spread.weigh(scores, lay).tolist() == [1.0, 3.0, 0.0, 4.0, 2.0, 2.0, 2.0, 2.0]  # mean spread 2; unknown: x1
    alone = variant_spread.scores(ScoringInput(None, None, lay))
    assert alone.tolist() == [0.5, 1.5, 0.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    lay.variant_spread = None
    assert torch.equal(variant_spread.weigh(scores, lay), scores)


def test_the_layout_holds_the_spread_of_every_blended_chunk_for_the_selector_that_reads_it(rag):
    lay = assembled(rag, "query_guided_spread").layout
    spread = lay.variant_spread
    assert spread.shape == lay.token_ids.shape and not bool(torch.isfinite(spread[lay.fresh_slots]).any())
    entries = {}
    for key in rag.store.keys():
        entry = rag.store.get(key, copy=False)[0]
        entries[(entry.token_ids, entry.meta.get("variant"))] = entry
    blended = 0
    for start, end in lay.chunk_spans:
        ids = tuple(lay.token_ids[start:end].tolist())
        if bool(torch.isfinite(spread[start:end]).all()):
            fused, plain = entries[(ids, "fused")], entries[(ids, "plain")]
            expected = entry_spread(fused.keys, fused.values, plain.keys, plain.values)
            assert torch.allclose(spread[start:end], expected) and bool((expected > 0).all())
            blended += 1
        else:
            assert not bool(torch.isfinite(spread[start:end]).any())
    assert blended >= 1
    assert assembled(rag, "query_guided_layers").layout.variant_spread is None  # measured only when read


@pytest.mark.parametrize("selector", ["query_guided_spread", "variant_spread"])
@pytest.mark.parametrize("knobs", [dict(variant_policy="always"), dict(kv_variant="plain")])
def test_the_spread_selectors_need_the_blend(selector, knobs):
    with pytest.raises(FusionRAGError, match=f"selector '{selector}' reads .* only variant_policy 'blend' measures"):
        plan_run("fusionrag", 0.2, selector=selector, **knobs)


def test_the_spread_is_the_upper_layers_kv_distance_per_token():
    layers, heads, tokens, dim = 4, 2, 3, 8
    plain_keys, plain_values = torch.randn(layers, heads, tokens, dim), torch.randn(layers, heads, tokens, dim)
    fused_keys, fused_values = plain_keys.clone(), plain_values.clone()
    fused_keys[2:, :, 1] += 1.0  # token 1's keys at the upper half
    fused_values[3, :, 2] -= 2.0  # token 2's values at the last layer
    fused_keys[:2] += 5.0  # the lower half does not count
    spread = entry_spread(fused_keys, fused_values, plain_keys, plain_values)
    expected = torch.tensor([0.0, (2 * heads * dim) ** 0.5, (heads * dim * 4.0) ** 0.5])
    assert torch.allclose(spread, expected)
