"""The method protocol (``fusionrag_llm/methods``): the registry refuses what it cannot run and says
what it takes; a method written outside the package (its own scores, a ``MethodRun`` with
``LayerHook``s, its own stats) runs through the facade like a built-in one; ``recompute_ratio=None``
is the method's own ratio. (r = 1 against Full Attention for every selecting method:
``tests/methods/test_invariants.py``.)"""

from dataclasses import FrozenInstanceError, dataclass

import pytest
import torch

from fusionrag_llm import (FusionRAGError, LayerHook, Method, MethodRun, Prefill, get_method,
                           method_names, register_method)  # fmt: skip
from fusionrag_llm import methods as registry
from fusionrag_llm.fusion.layout import RequestLayout, ScoringInput
from fusionrag_llm.methods import make_plan
from fusionrag_llm.methods.a3 import A3
from fusionrag_llm.methods.base import select_many
from lighthouse import REQUEST, lighthouse_rag

BUILT_IN = ("full_attention", "full_reuse", "cacheblend", "fusionrag", "fusionrag_paper", "a3", "epic", "cacheclip",
            "cache_craft", "ape")  # fmt: skip


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    """The built-in methods only, for the test's length: what it registers is gone after it, and what
    other tests of the process registered (the README's example) is not seen."""
    monkeypatch.setattr(registry, "_REGISTRY", {name: registry._REGISTRY[name] for name in BUILT_IN})


@pytest.fixture(scope="module")
def rag():
    return lighthouse_rag()


# ---------------------------------------------------------------- the registry


def test_an_unknown_method_is_refused_listing_the_registered_ones():
    with pytest.raises(FusionRAGError, match="unknown method 'magic'; valid methods: " + ", ".join(BUILT_IN)):
        get_method("magic")
    for bad in (None, 3, A3):  # not a name, not an instance (a class is neither)
        with pytest.raises(FusionRAGError, match="unknown method"):
            get_method(bad)


@pytest.mark.parametrize("name, takes", [
    ("a3", "it takes decode_kv_budget"), ("fusionrag", "it takes kv_shift"), ("cacheblend", "it takes none"),
    ("full_attention", "it takes none"),
])  # fmt: skip
def test_an_unknown_option_is_refused_listing_what_the_method_takes(name, takes):
    with pytest.raises(FusionRAGError, match=f"unknown option\\(s\\) budget, speed for method '{name}'; {takes}$"):
        get_method(name, speed=1, budget=8)


def test_options_make_a_frozen_method_and_an_instance_passes_as_it_is():
    method = get_method("a3", decode_kv_budget=8)
    assert method == A3(decode_kv_budget=8) and method != get_method("a3") and method.decode_kv_budget == 8
    with pytest.raises(FrozenInstanceError):
        method.decode_kv_budget = 9
    assert get_method(method) is method
    with pytest.raises(FusionRAGError, match="options go to get_method\\(name, ...\\) or the method's constructor"):
        get_method(method, decode_kv_budget=9)
    assert make_plan(method).method is method


class _Unnamed(Method):
    pass


@pytest.mark.parametrize("bad, message", [
    (get_method("a3"), "register_method takes a Method subclass, got A3"),  # an instance, not a class
    (dict, "register_method takes a Method subclass"),
    (_Unnamed, "a method's name must be a Python identifier, got ''"),
    (type("Spaced", (Method,), {"name": "two words"}), "a method's name must be a Python identifier, got 'two words'"),
    (type("Numbered", (Method,), {"name": 7}), "a method's name must be a Python identifier, got 7"),
    (type("OddKV", (Method,), {"name": "odd_kv", "chunk_kv": "mixed"}), "method 'odd_kv': chunk_kv must be one of"),
    (type("OddRatio", (Method,), {"name": "odd_ratio", "default_ratio": 1.5}),
     r"recompute_ratio must be a number in \[0, 1\], got 1.5"),
])  # fmt: skip
def test_register_method_refuses_what_it_cannot_run(bad, message):
    with pytest.raises(FusionRAGError, match=message):
        register_method(bad)
    assert method_names() == BUILT_IN


def test_a_taken_name_is_refused_unless_replaced():
    class Mine(Method):
        name = "fusionrag"

    with pytest.raises(FusionRAGError, match="a method named 'fusionrag' is already registered; pass replace=True"):
        register_method(Mine)
    built_in = type(get_method("fusionrag"))
    assert built_in is not Mine and built_in.__module__ == "fusionrag_llm.methods.fusionrag"
    assert register_method(Mine, replace=True) is Mine and isinstance(get_method("fusionrag"), Mine)
    assert register_method(Mine) is Mine  # the same class again: nothing changes
    assert method_names() == BUILT_IN  # replaced in place


# ---------------------------------------------------------------- a method from outside


class Recorder(LayerHook):
    """Every layer's call, with what it carried."""

    def __init__(self):
        self.before, self.after = [], []

    def before_write(self, layer, cache, keys, values):
        self.before.append((layer, keys.shape[1], values.shape[1]))

    def after_write(self, layer, queries, cache, step):
        self.after.append((layer, queries.shape[1], step.slots.clone()))


class _RecordingRun(MethodRun):
    def __init__(self, prefill: Prefill, runs: list):
        self.recorder = Recorder()
        self.hooks = (self.recorder,)
        self.prefill = prefill
        runs.append(self)

    def after_prefill(self, prefill):
        prefill.stats.update(layers_seen=len(self.recorder.after), rows=len(prefill.recompute))
        return None


RUNS: list[_RecordingRun] = []


@dataclass(frozen=True)
class EarliestFirst(Method):
    """Plain chunk KV; recompute the earliest reused tokens first; record every layer of the prefill."""

    name = "earliest_first"
    description = "the earliest reused tokens, a hook on every layer (a test method)"
    default_ratio = 0.25

    def scores(self, inp: ScoringInput) -> torch.Tensor:
        return -inp.layout.reused_slots.float()

    def start(self, prefill: Prefill) -> MethodRun:
        return _RecordingRun(prefill, RUNS)


def test_a_method_registered_from_outside_runs_through_the_facade_with_its_hooks_and_stats(rag):
    register_method(EarliestFirst)
    assert method_names() == (*BUILT_IN, "earliest_first")
    layers = rag.engine.model.cfg.num_layers
    RUNS.clear()
    out = rag.generate(REQUEST, method="earliest_first", max_new_tokens=3)  # recompute_ratio=None: its own 0.25
    (run,) = RUNS
    prefill = run.prefill
    reused, recompute = prefill.layout.reused_slots, prefill.recompute
    k = round(0.25 * len(reused))
    assert k > 0 and prefill.selected.tolist() == reused[:k].tolist()  # its own scores chose
    assert (out.stats.method, out.stats.recompute_ratio, out.stats.recomputed_tokens) == ("earliest_first", 0.25, k)
    assert bool(torch.isin(prefill.selected, recompute).all()) and not prefill.exact
    # the hook saw every layer of the sparse prefill once, with all its rows, before and after the write
    assert [layer for layer, _, _ in run.recorder.after] == list(range(layers))
    assert run.recorder.before == [(layer, len(recompute), len(recompute)) for layer in range(layers)]
    assert all(rows == len(recompute) and torch.equal(slots, recompute) for _, rows, slots in run.recorder.after)
    assert out.stats.method_stats == {"layers_seen": layers, "rows": len(recompute)}
    # every entry point, by name
    assert "".join(rag.stream(REQUEST, method="earliest_first", max_new_tokens=3)) == out.text
    assert [g.token_ids for g in rag.generate_many([REQUEST] * 2, method="earliest_first", max_new_tokens=3)] == \
        [out.token_ids] * 2  # fmt: skip
    logits = rag.logits(REQUEST, out.token_ids, method="earliest_first")
    assert logits[:-1].argmax(dim=-1).tolist() == out.token_ids
    # r = 1: whatever the scores, every reused token is recomputed: Full Attention
    full = rag.logits(REQUEST, out.token_ids, method="full_attention")
    assert (rag.logits(REQUEST, out.token_ids, method="earliest_first", recompute_ratio=1.0) - full).abs().max() <= 1e-4
    assert (logits - full).abs().max() > 1e-3


def test_an_instance_runs_without_being_registered(rag):
    RUNS.clear()
    out = rag.generate(REQUEST, method=EarliestFirst(), recompute_ratio=0.1, max_new_tokens=1)
    assert len(RUNS) == 1 and out.stats.method == "earliest_first" and out.stats.recompute_ratio == 0.1
    assert "earliest_first" not in method_names()


class _DropChunkRows(LayerHook):
    """After layer 0, the later layers run without the recomputed chunk tokens (as Cache-Craft's early stop)."""

    def __init__(self, droppable: torch.Tensor):
        self.droppable = droppable

    def after_write(self, layer, queries, cache, step):
        if self.keep is None:
            self.keep = ~self.droppable


@dataclass(frozen=True)
class EarlyStopping(EarliestFirst):
    name = "early_stopping"

    def start(self, prefill: Prefill) -> MethodRun:
        run = _RecordingRun(prefill, RUNS)
        run.hooks = (_DropChunkRows(torch.isin(prefill.recompute, prefill.selected)), run.recorder)
        return run


def test_a_hook_sees_every_layer_when_another_drops_rows_part_way(rag):
    RUNS.clear()
    out = rag.generate(REQUEST, method=EarlyStopping(), recompute_ratio=0.3, max_new_tokens=2)
    (run,) = RUNS
    recompute, selected = run.prefill.recompute, run.prefill.selected
    layers = rag.engine.model.cfg.num_layers
    assert [layer for layer, _, _ in run.recorder.after] == list(range(layers))
    rows = [n for _, n, _ in run.recorder.after]
    assert rows == [len(recompute)] + [len(recompute) - len(selected)] * (layers - 1)
    assert torch.equal(run.recorder.after[-1][2], recompute[~torch.isin(recompute, selected)])
    assert out.stats.method_stats["layers_seen"] == layers and len(out.token_ids) == 2


@dataclass(frozen=True)
class Broken(EarliestFirst):
    name = "broken"

    def scores(self, inp):
        raise RuntimeError("this scorer always fails")


def test_a_failing_scorer_fails_its_request_alone(rag):
    with pytest.raises(RuntimeError, match="this scorer always fails"):
        rag.generate(REQUEST, method=Broken(), max_new_tokens=1)
    assert not rag.engine.has_unfinished()
    assert rag.generate(REQUEST, method=EarliestFirst(), max_new_tokens=1).token_ids  # the engine goes on
    reused = torch.arange(2, 12)
    fresh = torch.tensor([0, 1, 12, 13, 14])
    layout = RequestLayout(torch.zeros(15, dtype=torch.long), reused, fresh, fresh[-3:], ((2, 12),))
    inp = ScoringInput(None, None, layout, k=3)
    failed, picked = select_many([(Broken(), 3, inp), (EarliestFirst(), 3, inp)], None)
    assert isinstance(failed, RuntimeError) and picked.tolist() == [2, 3, 4]


# ---------------------------------------------------------------- default ratios


@pytest.mark.parametrize("name", BUILT_IN)
def test_no_ratio_runs_the_methods_own(rag, name):
    method = get_method(name)
    out = rag.generate(REQUEST, method=name, max_new_tokens=1)
    expected = {"full_attention": 1.0, "full_reuse": 0.0, "ape": 0.0}.get(name, method.default_ratio)
    assert out.stats.recompute_ratio == expected and out.stats.method == name
    if name in ("full_reuse", "ape"):  # they select nothing, whatever is asked
        assert rag.generate(REQUEST, method=name, recompute_ratio=0.7, max_new_tokens=1).stats.recomputed_tokens == 0
    elif method.selects and name != "cacheclip":  # CacheClip's 8-token windows may drop every pick at 0.15
        assert out.stats.recomputed_tokens > 0
    assert rag.generate(REQUEST, method=name, recompute_ratio=0.5, max_new_tokens=1).stats.recompute_ratio == \
        (1.0 if name == "full_attention" else 0.0 if not method.selects else 0.5)  # fmt: skip
