"""The built-in methods as the registry lists them, and the plans ``make_plan`` makes of a method and a
ratio (the one place a run's ratio is checked)."""

import pytest

from fusionrag_llm import FusionRAGError, MissingDependencyError, RunPlan, get_method, method_names
from fusionrag_llm.errors import require
from fusionrag_llm.methods import make_plan
from fusionrag_llm.methods.base import CHUNK_KV

BUILT_IN = ("full_attention", "full_reuse", "cacheblend", "fusionrag", "fusionrag_paper", "a3", "epic", "cacheclip",
            "cache_craft", "ape")  # fmt: skip


def test_the_built_in_methods_come_first_in_order_and_describe_themselves():
    assert method_names()[: len(BUILT_IN)] == BUILT_IN
    for name in BUILT_IN:
        method = get_method(name)
        assert method.name == name and method.description and method.chunk_kv in CHUNK_KV
        assert 0 <= method.default_ratio <= 1
    assert [name for name in BUILT_IN if not get_method(name).selects] == ["full_attention", "full_reuse", "ape"]
    assert get_method("ape").parallel_positions and get_method("ape").attention_scaling == (0.9, 0.9)
    assert not any(get_method(name).parallel_positions for name in BUILT_IN if name != "ape")


def test_plans_follow_the_methods():
    assert make_plan("full_attention", 0.2).recompute_ratio == 1.0  # no reuse: every token is computed
    reuse = make_plan("full_reuse", 0.2)
    assert (reuse.name, reuse.recompute_ratio, reuse.reuses_chunks, reuse.exact) == ("full_reuse", 0.0, True, False)
    blend = make_plan("cacheblend", 0.3)
    assert isinstance(blend, RunPlan) and blend == make_plan(get_method("cacheblend"), 0.3)
    assert (blend.name, blend.recompute_ratio, blend.method.chunk_kv, blend.exact) == ("cacheblend", 0.3, "plain", False)
    assert make_plan("cacheblend", 1.0).exact and make_plan("full_attention").exact
    assert not make_plan("full_reuse", 1.0).exact  # selects nothing: its reused KV stays approximate
    assert make_plan().name == "fusionrag"  # the default method


@pytest.mark.parametrize("name", BUILT_IN)
def test_no_ratio_means_the_methods_own(name):
    method = get_method(name)
    expected = 1.0 if method.chunk_kv is None else method.default_ratio if method.selects else 0.0
    assert make_plan(name).recompute_ratio == make_plan(name, None).recompute_ratio == expected


@pytest.mark.parametrize("knobs, message", [
    (dict(method="magic"), "valid methods: full_attention, full_reuse, cacheblend, fusionrag, fusionrag_paper, a3, epic, cacheclip, cache_craft, ape"),
    (dict(method="fusionrag", recompute_ratio=1.5), r"recompute_ratio must be a number in \[0, 1\], got 1.5"),
    (dict(method="fusionrag", recompute_ratio=True), r"recompute_ratio must be a number in \[0, 1\]"),
    (dict(method="full_reuse", recompute_ratio=-0.1), r"recompute_ratio must be a number in \[0, 1\]"),  # checked anyway
    (dict(method="full_attention", recompute_ratio="all"), r"recompute_ratio must be a number in \[0, 1\]"),
])  # fmt: skip
def test_a_bad_plan_names_the_bad_knob(knobs, message):
    with pytest.raises(FusionRAGError, match=message):
        make_plan(**knobs)
    assert issubclass(FusionRAGError, ValueError)  # adapters' validators catch it as such


def test_a_missing_optional_dependency_names_its_extra():
    with pytest.raises(MissingDependencyError, match=r'pip install "fusionrag_llm\[langchain\]"') as info:
        require("no_such_framework_xyz.core", "langchain", "the LangChain adapter")
    assert isinstance(info.value, ImportError) and isinstance(info.value, ValueError)
