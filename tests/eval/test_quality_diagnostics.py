"""Per-question diagnostics: hand-checked distributions, harm counts and partings."""

import pytest

from fusionrag_llm.eval.quality_report import (distribution, greedy_agreement, greedy_agreement_markdown, partings,
                                               partings_markdown, per_question)


def _record(qid, method, ratio, kl, greedy_em=1.0):
    return {"qid": qid, "method": method, "ratio": ratio, "kl": kl, "greedy_em": greedy_em, "f1": 0.5}


RECORDS = [
    _record("q1", "full_reuse", None, 0.10), _record("q2", "full_reuse", None, 0.20),
    _record("q3", "full_reuse", None, 0.30, greedy_em=0.0), _record("q4", "full_reuse", None, 0.40),
    _record("q1", "fusionrag", 0.15, 0.05), _record("q2", "fusionrag", 0.15, 0.25, greedy_em=0.0),
    _record("q3", "fusionrag", 0.15, 0.30 + 1e-6, greedy_em=0.0), _record("q4", "fusionrag", 0.15, 0.90),
]  # fmt: skip


def test_distribution_counts_the_questions_a_method_makes_worse_than_full_reuse():
    rows = {(r["method"], r["ratio"]): r for r in distribution(RECORDS)}
    fusion = rows[("fusionrag", 0.15)]
    assert fusion["kl_max"] == 0.90 and fusion["worst_qid"] == "q4"
    assert fusion["kl_median"] == pytest.approx((0.25 + 0.30 + 1e-6) / 2)
    assert fusion["kl_p90"] == pytest.approx(0.30 + 1e-6 + 0.7 * (0.90 - 0.30 - 1e-6))  # rank 2.7 of 0..3
    assert fusion["worse_than_full_reuse"] == 2  # q2 and q4; q3 is a tie within the tolerance
    assert fusion["answer_lost"] == 1  # q2: Full Reuse kept FA's answer there; q3 both lost it
    assert rows[("full_reuse", None)]["worse_than_full_reuse"] == 0


def test_greedy_agreement_counts_the_questions_that_begin_with_full_attentions_tokens():
    def answer(qid, method, ids):
        return {"qid": qid, "method": method, "ratio": None if method != "fusionrag" else 0.15, "token_ids": ids}

    records = [answer("q1", "full_attention", [1, 2, 3, 4, 5]), answer("q2", "full_attention", [7, 8]),
               answer("q1", "fusionrag", [1, 2, 3, 9, 5]), answer("q2", "fusionrag", [7, 8, 2]),
               answer("q3", "fusionrag", [4])]  # fmt: skip
    rows = {row["method"]: row for row in greedy_agreement(records)}
    # k = 1, 2, 4 lie below the longest reference (5 tokens); q2 ended after 2 tokens where fusionrag went on
    assert rows["fusionrag"]["shares"] == {"1": 1.0, "2": 1.0, "4": 0.0} and rows["fusionrag"]["whole"] == 0.0
    assert rows["fusionrag"]["questions"] == 2  # q3 has no Full Attention answer
    assert rows["full_attention"]["shares"] == {"1": 1.0, "2": 1.0, "4": 1.0} and rows["full_attention"]["whole"] == 1.0
    assert "| fusionrag | 0.15 | 2 | 1.000 | 1.000 | 0.000 | 0.000 |" in greedy_agreement_markdown(list(rows.values()))


def test_partings_read_full_attentions_margin_where_each_answer_parts():
    def answer(qid, method, ids, **extra):
        return {"qid": qid, "method": method, "ratio": None if method == "full_attention" else 0.15, "token_ids": ids, **extra}

    records = [answer("q1", "full_attention", [1, 2, 3, 4], margins=[0.9, 0.8, 0.05, 0.7]),
               answer("q2", "full_attention", [7, 8], margins=[0.02, 0.6]),
               answer("q3", "full_attention", [5], margins=[0.5]),
               answer("q1", "fusionrag", [1, 2, 9, 4], parting_gap=0.04),  # parts at a near tie (0.05)
               answer("q2", "fusionrag", [7, 6], parting_gap=0.3),  # parts where FA was sure (0.6)
               answer("q3", "fusionrag", [5], parting_gap=None),  # agrees
               answer("q4", "fusionrag", [1], parting_gap=0.2)]  # no Full Attention answer: not counted
    summary = partings(records)
    assert summary["fa_near_tie_share"] == pytest.approx(2 / 7)  # 0.05 and 0.02 of FA's 7 answer tokens
    (row,) = summary["rows"]
    assert (row["method"], row["questions"], row["parted"]) == ("fusionrag", 3, 2)
    assert row["near_tie_share"] == 0.5 and row["fa_margin_median"] == pytest.approx((0.05 + 0.6) / 2)
    assert row["gap_median"] == pytest.approx((0.04 + 0.3) / 2)
    assert "| fusionrag | 0.15 | 3 | 2 | 0.500 | 0.325 | 0.170 |" in partings_markdown(summary)
    # logs written before margins were recorded: nothing to say, and no table
    assert partings([dict(r, margins=None) for r in records]) is None and partings_markdown(None) == ""


def test_per_question_rows_list_every_method():
    rows = {row["qid"]: row for row in per_question(RECORDS)}
    assert set(rows["q2"]["methods"]) == {"full_reuse", "fusionrag@0.15"}
    assert rows["q2"]["methods"]["fusionrag@0.15"] == {"kl": 0.25, "greedy_em": 0.0, "f1": 0.5}
