"""Benchmark helpers without a model: option parsing, the resumable log, aggregates and eq. 11."""

import doctest
import json
import math

import pytest

from fusionrag_llm.eval import bench_data, partial_log, results
from fusionrag_llm.eval.bench_data import jobs, needs_variant_notes, parse_lengths, parse_methods, parse_ratios
from fusionrag_llm.eval.partial_log import PartialLog
from fusionrag_llm.eval.quality_report import aggregate


@pytest.mark.parametrize("module", [partial_log, results, bench_data])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_methods_always_start_with_both_baselines_once():
    assert parse_methods("fusionrag,full_reuse,fusionrag") == ("full_attention", "full_reuse", "fusionrag")


@pytest.mark.parametrize("spec", ["fusion", "fusionrag:overlap", "fused+kv_deviation", "fusionrag~0", "a3@64", " , "])
def test_only_registered_method_names_are_accepted(spec):
    with pytest.raises(ValueError, match="valid methods: full_attention|is empty"):
        parse_methods(spec)


def test_methods_that_select_nothing_run_once_whatever_the_ratios():
    assert jobs(("full_attention", "full_reuse", "ape", "cacheblend"), (0.1, 0.3)) == [
        ("full_attention", None), ("full_reuse", None), ("ape", None), ("cacheblend", 0.1), ("cacheblend", 0.3)]


def test_only_cache_craft_needs_notes_on_its_fused_entries():
    assert needs_variant_notes(parse_methods("cache_craft"))
    assert not needs_variant_notes(parse_methods("fusionrag,cacheblend,fusionrag_paper,ape"))


def test_ratios_and_lengths_are_checked():
    assert parse_ratios("1, 0.15,0.15,0") == (0.0, 0.15, 1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        parse_ratios("0.1,1.5")
    with pytest.raises(ValueError, match="floats"):
        parse_ratios("a")
    assert parse_lengths("2000,1000") == (1000, 2000)
    with pytest.raises(ValueError, match=">= 16"):
        parse_lengths("8")


def test_the_baselines_run_once_every_other_method_at_every_ratio():
    pairs = jobs(parse_methods("cacheblend"), (0.0, 0.5))
    assert pairs == [("full_attention", None), ("full_reuse", None), ("cacheblend", 0.0), ("cacheblend", 0.5)]


def test_partial_log_resumes_refuses_other_config_and_survives_a_torn_line(tmp_path):
    path = tmp_path / "q.partial.jsonl"
    log = PartialLog(path, {"seed": 0})
    log.append({"qid": "a", "method": "fusionrag", "ratio": 0.15, "kl": math.nan})
    with path.open("a") as handle:
        handle.write('{"qid": "b", "meth')  # killed mid-write
    again = PartialLog(path, {"seed": 0})
    assert len(again) == 1 and again.get(("a", "fusionrag", 0.15))["kl"] is None
    again.append({"qid": "c", "method": "full_reuse", "ratio": None})
    assert PartialLog(path, {"seed": 0}).has(("c", "full_reuse", None))
    with pytest.raises(ValueError, match="differs in: seed.*delete it to start over"):
        PartialLog(path, {"seed": 1})
    path.unlink()
    assert len(PartialLog(path, {"seed": 1})) == 0


def _record(qid, method, ratio, f1, kl, first):
    return {"qid": qid, "method": method, "ratio": ratio, "f1": f1, "em": 0.0, "first_token": first,
            "greedy_em": 0.0, "kl": kl, "ttft_s": 0.1, "load_s": 0.0, "select_s": 0.0, "prefill_s": 0.1,
            "prompt_tokens": 10, "recomputed_tokens": 0, "computed_tokens": 10}  # fmt: skip


def test_aggregate_normalises_between_full_reuse_and_full_attention():
    methods = parse_methods("fusionrag")
    records = [
        _record("q1", "full_attention", None, 0.8, 0.0, 1.0), _record("q2", "full_attention", None, 0.6, 0.0, 1.0),
        _record("q1", "full_reuse", None, 0.2, 0.4, 0.0), _record("q2", "full_reuse", None, 0.2, 0.2, 1.0),
        _record("q1", "fusionrag", 0.15, 0.5, 0.1, 1.0), _record("q2", "fusionrag", 0.15, 0.4, 0.05, 1.0),
        _record("q3", "fusionrag", 0.15, 0.0, 9.0, 0.0),  # not a question of this run: ignored
    ]  # fmt: skip
    rows = {r["method"]: r for r in aggregate(records, methods, (0.15,), ["q1", "q2"])}
    assert rows["fusionrag"]["questions"] == 2
    assert rows["fusionrag"]["norm_f1"] == pytest.approx((0.45 - 0.2) / (0.7 - 0.2))
    assert rows["fusionrag"]["norm_kl"] == pytest.approx(1 - 0.075 / 0.3)
    assert rows["fusionrag"]["norm_first_token"] == pytest.approx(1.0)
    assert rows["full_attention"]["norm_kl"] == 1.0 and rows["full_reuse"]["norm_kl"] == 0.0
    assert rows["fusionrag"]["norm_em"] == 1.0  # no EM gap to close and nothing lost (eq. 11 degenerate case)
    assert json.dumps(results.json_safe(rows)).count("NaN") == 0
