"""The method and selector registries: rows as data, one validator, dispatch without special cases."""

import pytest
import torch

from fusionrag_llm import METHODS, SELECTORS, FusionRAGError, MissingDependencyError, check_run_options
from fusionrag_llm.engine import methods
from fusionrag_llm.errors import require
from fusionrag_llm.fusion.selectors import RequestLayout, select_tokens


def test_every_row_is_consistent_and_runs_on_this_engine():
    assert list(METHODS) == ["full_attention", "full_reuse", "cacheblend", "fusionrag", "fusionrag_paper", "a3", "epic",
                             "cacheclip", "cache_craft", "ape"]  # fmt: skip
    for spec in METHODS.values():
        assert spec.selector in SELECTORS and spec.kv_variant in (None, *methods.KV_VARIANTS)
        assert set(spec.stages) <= methods.ENGINE_STAGES and spec.description
    assert METHODS["epic"].stages == ("needs_chunk_boundaries",)
    assert METHODS["cacheclip"].stages == ("needs_chunk_boundaries", "auxiliary_model")
    assert METHODS["ape"].stages == ("attention_scaling", "parallel_positions")
    assert METHODS["cache_craft"].stages == ("needs_chunk_boundaries", "offline_metadata", "early_stop")
    assert METHODS["cache_craft"].variant_policy == "cfo"
    paper, default = METHODS["fusionrag_paper"], METHODS["fusionrag"]
    assert (paper.kv_variant, paper.selector, paper.variant_policy) == ("fused", "query_guided", "always")
    assert (default.kv_variant, default.selector, default.variant_policy) == ("fused", "query_guided_layers", "blend")
    assert all(spec.description for spec in SELECTORS.values())


@pytest.mark.parametrize("knobs, message", [
    (dict(method="magic"), "valid methods: full_attention, full_reuse, cacheblend, fusionrag, fusionrag_paper, a3, epic, cacheclip, cache_craft, ape"),
    (dict(method="fusionrag", kv_variant="mixed"), "valid: plain, fused"),
    (dict(method="fusionrag", selector="best"), "valid selectors: query_guided, query_guided_layers, query_guided_spread, variant_spread, query_guided_groups, query_guided_per_chunk, query_guided_two_stage, query_guided_kv_union, kv_deviation, early_attention, auxiliary_attention, cache_craft, chunk_starts, random, oracle, oracle_attention, none"),
    (dict(method="fusionrag", recompute_ratio=1.5), r"recompute_ratio must be a number in \[0, 1\]"),
    (dict(method="fusionrag", recompute_ratio=True), r"recompute_ratio must be a number in \[0, 1\]"),
    (dict(method="fusionrag", seed=-1), "seed must be an int >= 0"),
    (dict(method="full_attention", selector="random"), "full_attention reuses no chunk KV"),
])  # fmt: skip
def test_the_validator_names_the_bad_knob(knobs, message):
    with pytest.raises(FusionRAGError, match=message):
        check_run_options(**{"recompute_ratio": 0.15, **knobs})
    assert issubclass(FusionRAGError, ValueError)  # adapters' validators catch it as such


def test_plans_follow_the_rows():
    assert check_run_options(method="full_attention", recompute_ratio=0.2).recompute_ratio == 1.0
    reuse = check_run_options(method="full_reuse", recompute_ratio=0.2)
    assert (reuse.kv_variant, reuse.selector, reuse.recompute_ratio, reuse.ratio_free) == ("plain", "none", 0.0, True)
    ablation = check_run_options(method="fusionrag", recompute_ratio=0.2, kv_variant="plain", selector="random", seed=3)
    assert (ablation.kv_variant, ablation.selector, ablation.seed, ablation.ratio_free) == ("plain", "random", 3, False)
    assert methods.plan_run("cacheblend", 0.3) == check_run_options(method="cacheblend", recompute_ratio=0.3)


def test_a_row_needing_a_stage_the_engine_lacks_is_refused(monkeypatch):
    future = methods.MethodSpec("blend_layers", "plain", "kv_deviation", "a recompute set filtered layer by layer",
                                per_layer_selection=True)  # fmt: skip
    monkeypatch.setitem(methods.METHODS, "blend_layers", future)
    assert future.stages == ("per_layer_selection",)
    with pytest.raises(FusionRAGError, match="needs stage.*per_layer_selection"):
        check_run_options(method="blend_layers", recompute_ratio=0.1)
    with pytest.raises(FusionRAGError, match="variant_policy 'sometimes' is not one of"):
        methods.MethodSpec("odd", "fused", "none", variant_policy="sometimes")


def test_a_row_that_selects_without_reuse_is_refused():
    with pytest.raises(FusionRAGError, match="selector must be 'none'"):
        methods.MethodSpec("odd", None, "random")


def _layout(n_reused: int) -> RequestLayout:
    reused = torch.arange(2, 2 + n_reused)
    fresh = torch.arange(2 + n_reused, 5 + n_reused)
    return RequestLayout(torch.zeros(5 + n_reused, dtype=torch.long), reused, fresh, fresh[-2:])


def test_random_selection_is_the_seeded_permutation_prefix():
    layout = _layout(20)
    got = select_tokens("random", 6, None, None, layout, seed=7)
    order = torch.randperm(20, generator=torch.Generator().manual_seed(7))
    assert got.tolist() == layout.reused_slots[order[:6]].sort().values.tolist()


def test_none_selects_nothing_and_k_bounds_hold():
    layout = _layout(10)
    assert select_tokens("none", 5, None, None, layout).numel() == 0
    assert select_tokens("random", 0, None, None, layout).numel() == 0
    assert select_tokens("random", 99, None, None, layout).tolist() == layout.reused_slots.tolist()
    with pytest.raises(FusionRAGError, match="valid selectors"):
        select_tokens("best", 3, None, None, layout)


def test_a_missing_optional_dependency_names_its_extra():
    with pytest.raises(MissingDependencyError, match=r'pip install "fusionrag_llm\[langchain\]"') as info:
        require("no_such_framework_xyz.core", "langchain", "the LangChain adapter")
    assert isinstance(info.value, ImportError) and isinstance(info.value, ValueError)
