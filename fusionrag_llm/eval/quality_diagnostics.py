"""Per-question diagnostics of the quality benchmark: distributions, worst cases, harm against Full Reuse.

A mean can hide the questions a method makes worse. For every (method, ratio) of a run this gives
the distribution of its per-question KL(Full Attention || method) (median, 90th percentile, max and
the question at the max), the questions on which it is further from Full Attention than Full Reuse
is (``worse_than_full_reuse``: KL above Full Reuse's on the same question by more than
``HARM_TOLERANCE``), and those on which Full Reuse kept Full Attention's greedy answer but the
method did not (``answer_lost``). ``greedy_agreement`` says where greedy answers
part from Full Attention's: the share of questions whose first k generated tokens are Full
Attention's, for k = 1, 2, 4, ... and the whole answer (greedy EM). ``partings`` says how near a tie
Full Attention's own choice was at the token where each answer parts from it (its top-1 minus top-2
probability there, against the same over all its answer tokens), and how strongly the method
preferred its own token.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from fusionrag_llm.eval.metrics import parting_position
from fusionrag_llm.eval.results import fmt, markdown_table

HARM_TOLERANCE = 1e-4  # KL differences below this are ties (float noise between two exact paths)
NEAR_TIE = 0.1  # Full Attention's top-1 minus top-2 probability below this: a near tie


def per_question(records: list[dict]) -> list[dict]:
    """One row per question: its KL, greedy agreement with Full Attention and F1 for every method."""
    rows: dict[str, dict] = {}
    for record in records:
        row = rows.setdefault(record["qid"], {"qid": record["qid"], "methods": {}})
        row["methods"][_label(record["method"], record["ratio"])] = {
            "kl": record["kl"], "greedy_em": record["greedy_em"], "f1": record["f1"]}  # fmt: skip
    return list(rows.values())


def distribution(records: list[dict]) -> list[dict]:
    """Per (method, ratio), in the records' order: the per-question KL distribution and the harm counts."""
    baseline = {r["qid"]: r for r in records if r["method"] == "full_reuse"}
    rows = []
    for (method, ratio), mine in _by_run(records).items():
        kls = sorted(r["kl"] for r in mine)
        worst = max(mine, key=lambda r: r["kl"])
        paired = [(r, baseline[r["qid"]]) for r in mine if r["qid"] in baseline]
        rows.append({
            "method": method, "ratio": ratio, "questions": len(mine),
            "kl_median": statistics.median(kls), "kl_p90": _quantile(kls, 0.9), "kl_max": worst["kl"],
            "worst_qid": worst["qid"],
            "worse_than_full_reuse": sum(r["kl"] > fr["kl"] + HARM_TOLERANCE for r, fr in paired),
            "answer_lost": sum(fr["greedy_em"] == 1 and r["greedy_em"] < 1 for r, fr in paired),
            "compared": len(paired),
        })  # fmt: skip
    return rows


def greedy_agreement(records: list[dict]) -> list[dict]:
    """Per (method, ratio), in the records' order: the share of questions whose greedy answer begins
    with Full Attention's first k tokens (``shares``, k = 1, 2, 4, ... below the longest reference
    answer) and equals it whole (``whole``, the greedy EM). An answer that ends before k tokens agrees
    through k only if the other ends with it, so ``whole`` is the share that agrees through every k."""
    reference = {r["qid"]: list(r["token_ids"]) for r in records if r["method"] == "full_attention"}
    longest = max((len(ids) for ids in reference.values()), default=0)
    lengths = [1 << i for i in range(longest.bit_length()) if 1 << i < longest]
    rows = []
    for (method, ratio), mine in _by_run(records).items():
        pairs = [(list(r["token_ids"]), reference[r["qid"]]) for r in mine if r["qid"] in reference]
        if not pairs:
            continue
        rows.append({
            "method": method, "ratio": ratio, "questions": len(pairs),
            "shares": {str(k): sum(ids[:k] == ref[:k] for ids, ref in pairs) / len(pairs) for k in lengths},
            "whole": sum(ids == ref for ids, ref in pairs) / len(pairs),
        })  # fmt: skip
    return rows


def greedy_agreement_markdown(rows: list[dict]) -> str:
    lengths = list(rows[0]["shares"]) if rows else []
    headers = ["method", "ratio", "n", *(f"first {k}" for k in lengths), "whole answer"]
    table = [[r["method"], "-" if r["ratio"] is None else f"{r['ratio']:g}", r["questions"],
              *(fmt(r["shares"][k]) for k in lengths), fmt(r["whole"])] for r in rows]  # fmt: skip
    return ("## Greedy agreement by answer length\n\nShare of questions whose greedy answer begins with Full "
            "Attention's first k tokens; 'whole answer' is the greedy EM.\n\n" + markdown_table(headers, table) + "\n")


def partings(records: list[dict]) -> dict | None:
    """Where greedy answers part from Full Attention's, how close its own choice was there.

    Needs Full Attention's records with ``margins`` (None when none has them: logs written before
    they were recorded). ``fa_near_tie_share``: the share of all of Full Attention's answer tokens
    whose margin is below ``NEAR_TIE``. Per (method, ratio): ``parted`` answers (of ``questions``), the
    share of those whose parting token is such a near tie for Full Attention, the median margin there
    and the median ``parting_gap`` (how strongly the method preferred its own token).
    """
    margins = {r["qid"]: (list(r["token_ids"]), r["margins"]) for r in records
               if r["method"] == "full_attention" and r.get("margins") is not None}  # fmt: skip
    if not margins:
        return None
    every = [m for _, ms in margins.values() for m in ms]
    rows = []
    for (method, ratio), mine in _by_run(records).items():
        mine = [r for r in mine if r["qid"] in margins]
        if method == "full_attention" or not mine:
            continue
        at = [(r, parting_position(margins[r["qid"]][0], r["token_ids"])) for r in mine]
        parted = [(r, p) for r, p in at if p is not None]
        # an answer that goes on after Full Attention's ended parts where Full Attention has no margin
        there = [margins[r["qid"]][1][p] for r, p in parted if p < len(margins[r["qid"]][1])]
        gaps = [r["parting_gap"] for r, _ in parted if r.get("parting_gap") is not None]
        rows.append({
            "method": method, "ratio": ratio, "questions": len(mine), "parted": len(parted),
            "near_tie_share": sum(m < NEAR_TIE for m in there) / len(there) if there else math.nan,
            "fa_margin_median": statistics.median(there) if there else math.nan,
            "gap_median": statistics.median(gaps) if gaps else math.nan,
        })  # fmt: skip
    return {"near_tie": NEAR_TIE, "fa_near_tie_share": sum(m < NEAR_TIE for m in every) / max(len(every), 1),
            "rows": rows}  # fmt: skip


def partings_markdown(summary: dict | None) -> str:
    if summary is None:
        return ""
    headers = ["method", "ratio", "n", "answers that part", "FA near tie there", "FA margin there (median)",
               "method's own gap there (median)"]  # fmt: skip
    table = [[r["method"], "-" if r["ratio"] is None else f"{r['ratio']:g}", r["questions"], r["parted"],
              fmt(r["near_tie_share"]), fmt(r["fa_margin_median"], 3), fmt(r["gap_median"], 3)]
             for r in summary["rows"]]  # fmt: skip
    return ("## Where greedy answers part\n\nAt the token where a method's greedy answer first differs from Full "
            "Attention's: Full Attention's top-1 minus top-2 probability there ('near tie': below "
            f"{summary['near_tie']:g}; {fmt(summary['fa_near_tie_share'])} of all of Full Attention's answer tokens "
            "are near ties), and the method's probability of its own token minus that of Full Attention's.\n\n"
            + markdown_table(headers, table) + "\n")  # fmt: skip


def distribution_markdown(rows: list[dict]) -> str:
    headers = ["method", "ratio", "n", "KL median", "KL p90", "KL max", "worst question",
               "KL > Full Reuse", "FA answer lost vs Full Reuse"]  # fmt: skip
    table = [[r["method"], "-" if r["ratio"] is None else f"{r['ratio']:g}", r["questions"], fmt(r["kl_median"], 4),
              fmt(r["kl_p90"], 4), fmt(r["kl_max"], 4), r["worst_qid"], f"{r['worse_than_full_reuse']}/{r['compared']}",
              f"{r['answer_lost']}/{r['compared']}"] for r in rows]  # fmt: skip
    return ("## Per question\n\nKL(FA‖m) over the questions; 'KL > Full Reuse': questions on which the method is "
            f"further from Full Attention than Full Reuse (by more than {HARM_TOLERANCE:g}); 'FA answer lost': "
            "Full Reuse kept Full Attention's greedy answer and the method did not.\n\n"
            + markdown_table(headers, table) + "\n")  # fmt: skip


def plot_per_question(records: list[dict], path: Path, title: str) -> Path:
    """Per-question KL of every (method, ratio) as box plots with the points over them (log y)."""
    from fusionrag_llm.eval.plots import pyplot, save_figure

    plt = pyplot()
    groups: dict[str, list[float]] = {}
    for record in records:
        if record["method"] != "full_attention":  # its KL is 0 by definition
            groups.setdefault(_label(record["method"], record["ratio"]), []).append(max(record["kl"], 1e-6))
    fig, ax = plt.subplots(figsize=(max(6.4, 0.7 * len(groups) + 2), 4.4))
    labels = list(groups)
    if labels:
        ax.boxplot([groups[k] for k in labels], showfliers=False)
        for i, label in enumerate(labels, start=1):
            ax.scatter([i] * len(groups[label]), groups[label], s=8, alpha=0.5)
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
    ax.set_ylabel("KL(FA || method) per question")
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, plt, path)


def _by_run(records: list[dict]) -> dict[tuple, list[dict]]:
    """The records of each (method, ratio), in the records' order."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault((record["method"], record["ratio"]), []).append(record)
    return groups


def _label(method: str, ratio: float | None) -> str:
    return method if ratio is None else f"{method}@{ratio:g}"


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return math.nan
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)
