"""A3's decode KV eviction (``get_method("a3", decode_kv_budget=N)``): which tokens each (layer,
kv-head) keeps, against the window's attention computed here by hand; no eviction when the budget holds
every chunk token; the first decode step over the compacted cache against explicit attention over the
kept tokens only; every entry point; bad values; shared store entries untouched."""

from dataclasses import dataclass

import pytest
import torch

from fusionrag_llm import DecodeEviction, FusionRAGError, MethodRun, get_method
from fusionrag_llm.methods import make_plan
from fusionrag_llm.methods.a3 import A3
from fusionrag_llm.models.forward import ForwardPass
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.kv_eviction import decode_eviction, keep_index
from lighthouse import REQUEST, lighthouse_rag

BUDGET = 20


@pytest.fixture(scope="module")
def rag():
    return lighthouse_rag()


@dataclass
class Evicted:
    """What A3's run saw of one request: its prefill, its run (the window's scores), the cache the
    prefill left (a copy, before eviction), and the compacted cache it decodes on with its length then."""

    prefill: object
    run: MethodRun
    before: KVCache
    kept: KVCache
    kept_length: int

    @property
    def layout(self):
        return self.prefill.layout


RECORDED: list[Evicted] = []


class _Recording(MethodRun):
    def __init__(self, run: MethodRun):
        self.run, self.hooks = run, run.hooks

    def after_prefill(self, prefill):
        before = prefill.cache.fork()
        kept = self.run.after_prefill(prefill)
        kept = prefill.cache if kept is None else kept
        RECORDED.append(Evicted(prefill, self.run, before, kept, kept.length))
        return kept


class RecordingA3(A3):
    """A3 as it is, recording each request's eviction in ``RECORDED``."""

    def start(self, prefill):
        return _Recording(super().start(prefill))


def prefilled(rag, budget, ratio=0.3):
    """One request answered by A3 with ``budget``: its output and what its run recorded."""
    RECORDED.clear()
    out = rag.generate(REQUEST, method=RecordingA3(decode_kv_budget=budget), recompute_ratio=ratio, max_new_tokens=4)
    assert len(RECORDED) == 1
    return out, RECORDED[0]


def expected_keep(model, cache, layout, window, budget, kernel=7):
    """Per layer and kv-head, the slots SnapKV keeps, from the window's attention computed here."""
    n, cfg = len(layout.token_ids), model.cfg
    group = cfg.num_heads // cfg.num_kv_heads
    # the window's queries: the last `window` prompt tokens at every layer, from an exact run of the
    # request's own cache (every prompt KV in place), capturing the rotated queries of the window
    probe = cache.fork()
    slots = torch.arange(n - window, n)
    out = model(ForwardPass(layout.token_ids[slots], slots, slots, logit_rows=slots[:0],
                            capture_query_layers=frozenset(range(cfg.num_layers))), probe)  # fmt: skip
    chunk = torch.zeros(n, dtype=torch.bool)
    for start, end in layout.chunk_spans:
        chunk[start:end] = True
    chunk[n - window :] = False
    kept = []
    for layer in range(cfg.num_layers):
        q = out.queries[layer].float()  # [heads, window, d]
        keys = probe.keys[layer, :, :n].float().repeat_interleave(group, dim=0)
        logits = q @ keys.transpose(1, 2) / cfg.head_dim**0.5
        causal = torch.arange(n)[None, :] <= slots[:, None]
        attn = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1).sum(dim=1)  # [heads, n]
        per_kv = attn.reshape(cfg.num_kv_heads, group, n).mean(dim=1)
        heads = []
        for h in range(cfg.num_kv_heads):
            score = per_kv[h] * chunk
            pooled = torch.tensor([score[max(0, i - kernel // 2) : i + kernel // 2 + 1].max() for i in range(n)])
            pooled[~chunk] = -1
            top = set(torch.topk(pooled, budget).indices.tolist())
            heads.append(sorted(top | set(torch.nonzero(~chunk).flatten().tolist())))
        kept.append(heads)
    return kept, chunk


def test_each_head_keeps_the_tokens_its_window_attends_to_most(rag):
    model = rag.engine.model
    out, seen = prefilled(rag, BUDGET)
    layout, before = seen.layout, seen.before
    n, window = len(layout.token_ids), 32
    assert len(layout.suffix_slots) >= window  # the question is computed: the whole window is in the prefill
    expected, chunk = expected_keep(model, before, layout, window, BUDGET)
    protected = n - int(chunk.sum())
    assert seen.kept_length == protected + BUDGET == out.stats.method_stats["decode_kv_tokens"]
    assert out.stats.method_stats["evicted_kv_tokens"] == n - seen.kept_length > 0
    # the kept KV is exactly the prefilled cache's KV at each head's expected slots
    index = torch.tensor(expected)  # [layers, kv_heads, kept]
    gathered = torch.gather(before.keys[:, :, :n], 2, index[..., None].expand(-1, -1, -1, before.keys.shape[3]))
    torch.testing.assert_close(seen.kept.keys[:, :, : seen.kept_length], gathered, rtol=0, atol=0)
    heads = [tuple(h) for layer in expected for h in layer]
    assert len(set(heads)) > 1  # heads do keep different tokens
    assert seen.kept.capacity == seen.kept_length + 4  # the evicted slots are gone: room for the answer only


def test_a_budget_holding_every_chunk_token_changes_nothing(rag):
    out, seen = prefilled(rag, 10_000)
    counts = out.stats.method_stats
    assert counts["evicted_kv_tokens"] == 0 and counts["decode_kv_tokens"] == len(seen.layout.token_ids)
    roomy = get_method("a3", decode_kv_budget=10_000)
    kept = rag.logits(REQUEST, [65, 66, 67], method=roomy, recompute_ratio=0.3)
    plain = rag.logits(REQUEST, [65, 66, 67], method="a3", recompute_ratio=0.3)
    torch.testing.assert_close(kept, plain, rtol=0, atol=0)
    assert rag.generate(REQUEST, method=roomy, max_new_tokens=6).token_ids == \
        rag.generate(REQUEST, method="a3", max_new_tokens=6).token_ids  # fmt: skip
    assert rag.generate(REQUEST, method="a3", max_new_tokens=2).stats.method_stats == {}  # no budget: no eviction


def test_the_first_decode_step_attends_over_the_kept_tokens_only(rag):
    """The engine's first decode step on the compacted cache (the logits after the first answer token),
    and the same token on the full prefilled cache with every evicted (layer, head, token) masked out by
    hand: same logits."""
    model = rag.engine.model
    out, seen = prefilled(rag, BUDGET)
    before = seen.before
    n, cfg = len(seen.layout.token_ids), model.cfg
    token = out.token_ids[0]
    got = rag.logits(REQUEST, [token], method=get_method("a3", decode_kv_budget=BUDGET), recompute_ratio=0.3)[-1]

    # explicit: the full prefilled cache, each (layer, kv-head) seeing only the slots it keeps
    kept = torch.zeros(cfg.num_layers, cfg.num_kv_heads, n, dtype=torch.bool)
    index = keep_index(torch.stack(seen.run.scores.scores), _candidates(seen, n), before.valid[:n],
                       decode_eviction(BUDGET))  # fmt: skip
    kept.scatter_(2, index, True)
    assert not bool(kept.all())
    explicit = _decode_with_masks(model, before, kept, token, n)
    torch.testing.assert_close(got, explicit, rtol=1e-4, atol=1e-4)
    whole = torch.ones_like(kept)
    assert not torch.allclose(_decode_with_masks(model, before, whole, token, n), got, atol=1e-4)  # eviction mattered


def _candidates(seen, n):
    chunk = torch.zeros(n, dtype=torch.bool)
    for start, end in seen.layout.chunk_spans:
        chunk[start:end] = True
    chunk[seen.run.scores.window_start :] = False
    return chunk


def _decode_with_masks(model, cache, kept, token, n):
    """One decode step over ``cache`` where (layer, kv-head) sees only its ``kept`` [layers, kv_heads, n]
    prompt slots: attention written out here, every other part of the layer as the model has it."""
    cfg = model.cfg
    group = cfg.num_heads // cfg.num_kv_heads
    x = model.model.embed_tokens(torch.tensor([token]))
    position = torch.tensor([n])
    for layer, block in enumerate(model.model.layers):
        attn = block.self_attn
        q, k, v = attn.project(block.input_layernorm(x))
        q, k = model.rotate(q, position), model.rotate(k, position)
        keys = torch.cat([cache.keys[layer, :, :n], k], dim=1).float().repeat_interleave(group, 0)
        values = torch.cat([cache.values[layer, :, :n], v], dim=1).float().repeat_interleave(group, 0)
        visible = torch.cat([kept[layer], torch.ones(cfg.num_kv_heads, 1, dtype=torch.bool)], dim=1)
        visible = visible.repeat_interleave(group, 0)[:, None, :]  # [heads, 1, n + 1]
        logits = (q.float() @ keys.transpose(1, 2) / cfg.head_dim**0.5).masked_fill(~visible, float("-inf"))
        out = (torch.softmax(logits, dim=-1) @ values).to(x.dtype)  # [heads, 1, d]
        h = x + attn.o_proj(out.transpose(0, 1).reshape(1, -1))
        x = h + block.mlp(block.post_attention_layernorm(h))
    return model.lm_head(model.model.norm(x)).float()[0]


def test_every_entry_point_runs_with_eviction(rag):
    knobs = dict(method=get_method("a3", decode_kv_budget=BUDGET), recompute_ratio=0.3)
    alone = rag.generate(REQUEST, max_new_tokens=4, **knobs)
    assert alone.stats.method_stats["evicted_kv_tokens"] > 0 and alone.stats.method_stats["decode_kv_tokens"] > 0
    streamed = "".join(rag.stream(REQUEST, max_new_tokens=4, **knobs))
    assert streamed == alone.text
    logits = rag.logits(REQUEST, alone.token_ids, **knobs)
    assert logits[:-1].argmax(dim=-1).tolist() == alone.token_ids
    stream = rag.stream(REQUEST, max_new_tokens=4, **knobs)
    list(stream)
    torch.testing.assert_close(stream.score([*alone.token_ids, 0]), logits, rtol=1e-4, atol=1e-4)  # same evicted context
    two = rag.generate(REQUEST, max_new_tokens=4, n=2, **knobs)
    assert two.token_ids == two.others[0].token_ids == alone.token_ids  # greedy forks of one evicted cache


def test_a_batch_mixes_evicting_and_whole_caches(rag):
    """generate_many batches decode steps of caches of different lengths: with and without eviction."""
    budgeted = get_method("a3", decode_kv_budget=BUDGET)
    evicting = rag.generate(REQUEST, method=budgeted, max_new_tokens=5)
    whole = rag.generate(REQUEST, method="a3", max_new_tokens=5)
    engine, plans = rag.engine, [make_plan(budgeted), make_plan("a3")]
    segments = rag.segments(REQUEST)
    seqs = [engine.add_request(segments, plan, 5) for plan in plans + plans]
    engine.run_until_finished(seqs)
    assert [s.token_ids for s in seqs] == [evicting.token_ids, whole.token_ids] * 2
    assert [s.stats.method_stats.get("evicted_kv_tokens", 0) > 0 for s in seqs] == [True, False, True, False]
    many = rag.generate_many([REQUEST, REQUEST], method=budgeted, max_new_tokens=5)
    assert [o.token_ids for o in many] == [evicting.token_ids] * 2


def test_shared_store_entries_are_never_modified(rag):
    before = {key: (e.keys.clone(), e.values.clone()) for key, e in _stored(rag.store)}
    assert before
    rag.generate(REQUEST, method=get_method("a3", decode_kv_budget=5), max_new_tokens=4)
    rag.generate_many([REQUEST, REQUEST], method=get_method("a3", decode_kv_budget=5), recompute_ratio=0.0,
                      max_new_tokens=4)  # fmt: skip
    after = dict(_stored(rag.store))
    for key, (keys, values) in before.items():
        assert torch.equal(after[key].keys, keys) and torch.equal(after[key].values, values)


def _stored(store):
    return [(key, store.get(key, copy=False)[0]) for key in store.keys()]


@pytest.mark.parametrize("value, message", [
    (0, r"budget must be an int >= 1, got 0"),
    (-3, r"budget must be an int >= 1"),
    (2.5, r"decode_kv_budget must be None \(no eviction\), an int >= 1"),
    (True, r"decode_kv_budget must be None"),
    ("64", r"decode_kv_budget must be None"),
])  # fmt: skip
def test_bad_budgets_are_refused_naming_what_is_allowed(value, message):
    with pytest.raises(ValueError, match=message):
        get_method("a3", decode_kv_budget=value)


def test_bad_settings_and_methods_are_refused():
    with pytest.raises(ValueError, match=r"kernel must be odd"):
        DecodeEviction(8, kernel=4)
    with pytest.raises(ValueError, match=r"pooling must be one of max, avg, got 'mean'"):
        DecodeEviction(8, pooling="mean")
    with pytest.raises(FusionRAGError, match=r"window must be an int >= 1"):
        DecodeEviction(8, window=0)
    for method in ("ape", "cacheblend", "full_attention"):  # A3's option, no other method's
        with pytest.raises(FusionRAGError, match=f"unknown option.*decode_kv_budget for method '{method}'; it takes"):
            get_method(method, decode_kv_budget=8)
    assert get_method("a3", decode_kv_budget=DecodeEviction(8, window=4)).decode_kv_budget.window == 4


def test_keep_index_pools_and_keeps_protected_slots():
    """Slots 2..9 may go; 0, 1, 10, 11 are protected. A protected slot's score never lifts its
    neighbours; max pooling keeps a strong token's neighbours with it; avg pooling weighs them."""
    scores = torch.zeros(1, 2, 12)
    scores[0, 0, 1], scores[0, 0, 5] = 5.0, 1.0  # head 0: 1 protected, 5 strong, 2 and 3 close behind
    scores[0, 0, 2], scores[0, 0, 3] = 0.8, 0.9
    scores[0, 1, 9], scores[0, 1, 3], scores[0, 1, 7] = 1.0, 0.6, 0.1  # head 1: 9 strong, 3 next
    candidates = torch.zeros(12, dtype=torch.bool)
    candidates[2:10] = True
    valid = torch.ones(12, dtype=torch.bool)
    index = keep_index(scores, candidates, valid, DecodeEviction(5, kernel=3))
    assert index[0].tolist() == [[0, 1, 2, 3, 4, 5, 6, 10, 11], [0, 1, 2, 3, 4, 8, 9, 10, 11]]
    avg = keep_index(scores, candidates, valid, DecodeEviction(1, kernel=3, pooling="avg"))
    assert avg[0].tolist() == [[0, 1, 4, 10, 11], [0, 1, 8, 10, 11]]  # (0.9 + 0 + 1) / 3 and (0.1 + 0 + 1) / 3
    unpooled = keep_index(scores, candidates, valid, DecodeEviction(1, kernel=1))
    assert unpooled[0].tolist() == [[0, 1, 5, 10, 11], [0, 1, 9, 10, 11]]
    assert keep_index(scores, candidates, valid, DecodeEviction(8)) is None  # the budget holds every candidate


def test_the_evicted_kv_is_freed_and_the_batch_decodes_on(rag):
    """After the step that prefilled and evicted, the prefill's full cache is gone (nothing holds it)
    and the sequence decodes on from its smaller cache."""
    import gc
    import weakref

    engine, made = rag.engine, []
    new_cache = engine.runner.new_cache

    def recording(capacity, *rest):
        cache = new_cache(capacity, *rest)
        made.append(weakref.ref(cache.keys))
        return cache

    engine.runner.new_cache = recording
    try:
        seq = engine.add_request(rag.segments(REQUEST), make_plan(get_method("a3", decode_kv_budget=BUDGET)), 3)
        engine.step()
    finally:
        del engine.runner.new_cache
    gc.collect()
    assert len(made) == 1 and made[0]() is None  # the prompt's full KV was freed
    assert seq.cache.capacity == seq.cache.length + 3  # room for the answer only, no evicted slot
    assert seq.stats.method_stats["evicted_kv_tokens"] > 0
    engine.run_until_finished([seq])
    assert len(seq.token_ids) == 3
