"""Aggregates, normalised scores, per-question diagnostics, tables and plots of the quality benchmark.

Means are taken per (method, ratio) over the questions of the run. Normalised scores follow eq. 11
of the FusionRAG paper on those means, with Full Reuse at 0 and Full Attention at 1 from the same
run: ``norm_f1`` on F1, ``norm_em`` on EM, and two normalised fidelities: ``norm_kl`` on the mean
KL (Full Attention's KL is 0, so it is ``1 - KL / KL_full_reuse``) and ``norm_first_token`` on the
first-token agreement (Full Attention's is 1). A score whose two baselines coincide is 1.0 when the
method matches them too, else undefined (``null`` in JSON, ``-`` in tables).

A mean can hide the questions a method makes worse, so per (method, ratio) the report also gives
the distribution of its per-question KL (median, 90th percentile, max and the question at the max),
the questions on which it is further from Full Attention than Full Reuse is
(``worse_than_full_reuse``: by more than ``HARM_TOLERANCE``) and those on which Full Reuse kept Full
Attention's greedy answer but the method did not (``answer_lost``). ``greedy_agreement`` says where
greedy answers part from Full Attention's: the share of questions whose first k generated tokens are
Full Attention's, for k = 1, 2, 4, ... and the whole answer (greedy EM). ``partings`` says how near a
tie Full Attention's own choice was at the token where each answer parts from it (its top-1 minus
top-2 probability there, against the same over all its answer tokens), and how strongly the method
preferred its own token.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from fusionrag_llm.eval.bench_data import BASELINES, jobs
from fusionrag_llm.eval.metrics import normalized_score, parting_position
from fusionrag_llm.eval.results import (figure, finite_number, fmt, machine_line, markdown_table, mean, ms, quantile,
                                        ratio_cell, reference_colour, run_label, write_report)

MEAN_FIELDS = ("f1", "em", "first_token", "greedy_em", "kl", "ttft_s", "load_s", "select_s", "prefill_s",
               "prompt_tokens", "recomputed_tokens", "computed_tokens")  # fmt: skip
NORMALISED = {"norm_f1": "f1", "norm_em": "em", "norm_kl": "kl", "norm_first_token": "first_token"}
HARM_TOLERANCE = 1e-4  # KL differences below this are ties (float noise between two exact paths)
NEAR_TIE = 0.1  # Full Attention's top-1 minus top-2 probability below this: a near tie


def aggregate(records: list[dict], methods: tuple[str, ...], ratios: tuple[float, ...],
              qids: list[str]) -> list[dict]:  # fmt: skip
    """One row per (method, ratio) of the run, over the questions in ``qids``; then eq. 11 scores."""
    wanted = set(qids)
    rows = []
    for method, ratio in jobs(methods, ratios):
        mine = [r for r in records if r["method"] == method and r["ratio"] == ratio and r["qid"] in wanted]
        row = {"method": method, "ratio": ratio, "questions": len(mine)}
        row.update({name: mean([r[name] for r in mine]) for name in MEAN_FIELDS})
        rows.append(row)
    full_attention, full_reuse = ({row["method"]: row for row in rows}[name] for name in BASELINES)
    for row in rows:
        for name, source in NORMALISED.items():
            values = (row[source], full_reuse[source], full_attention[source])
            row[name] = normalized_score(*values, tol=1e-12) if all(map(finite_number, values)) else math.nan
    return rows


def per_question(records: list[dict]) -> list[dict]:
    """One row per question: its KL, greedy agreement with Full Attention and F1 for every method."""
    rows: dict[str, dict] = {}
    for record in records:
        row = rows.setdefault(record["qid"], {"qid": record["qid"], "methods": {}})
        row["methods"][run_label(record["method"], record["ratio"])] = {
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
            "kl_median": statistics.median(kls), "kl_p90": quantile(kls, 0.9), "kl_max": worst["kl"],
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


def _by_run(records: list[dict]) -> dict[tuple, list[dict]]:
    """The records of each (method, ratio), in the records' order."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault((record["method"], record["ratio"]), []).append(record)
    return groups


def quality_markdown(rows: list[dict], config: dict, machine: dict) -> str:
    headers = ["method", "ratio", "n", "F1", "EM", "norm F1", "KL(FA‖m)", "norm KL", "first tok", "norm first",
               "greedy EM", "TTFT ms", "recomputed"]  # fmt: skip
    table = [
        [row["method"], ratio_cell(row["ratio"]), row["questions"], fmt(row["f1"]), fmt(row["em"]), fmt(row["norm_f1"]),
         fmt(row["kl"], 4), fmt(row["norm_kl"]), fmt(row["first_token"]), fmt(row["norm_first_token"]),
         fmt(row["greedy_em"]), ms(row["ttft_s"]), fmt(row["recomputed_tokens"], 1)]
        for row in rows
    ]  # fmt: skip
    skipped = f" (after the first {config['skip']})" if config.get("skip") else ""
    head = (f"# Quality: {config['model']} on {Path(config['dataset']).name}\n\n"
            f"{rows[0]['questions'] if rows else 0} questions{skipped} x {config['passages']} passages, "
            f"neighbors={config['neighbors']}, max_new_tokens={config['max_new_tokens']}; {machine_line(machine)}.\n\n"
            "Ratio '-': the method does not depend on it. norm = eq. 11 (Full Reuse 0, Full Attention 1).\n\n")  # fmt: skip
    return head + markdown_table(headers, table) + "\n"


def distribution_markdown(rows: list[dict]) -> str:
    headers = ["method", "ratio", "n", "KL median", "KL p90", "KL max", "worst question",
               "KL > Full Reuse", "FA answer lost vs Full Reuse"]  # fmt: skip
    table = [[r["method"], ratio_cell(r["ratio"]), r["questions"], fmt(r["kl_median"], 4), fmt(r["kl_p90"], 4),
              fmt(r["kl_max"], 4), r["worst_qid"], f"{r['worse_than_full_reuse']}/{r['compared']}",
              f"{r['answer_lost']}/{r['compared']}"] for r in rows]  # fmt: skip
    return ("## Per question\n\nKL(FA‖m) over the questions; 'KL > Full Reuse': questions on which the method is "
            f"further from Full Attention than Full Reuse (by more than {HARM_TOLERANCE:g}); 'FA answer lost': "
            "Full Reuse kept Full Attention's greedy answer and the method did not.\n\n"
            + markdown_table(headers, table) + "\n")  # fmt: skip


def served_markdown(records: list[dict]) -> str:
    """Which entries each method's requests were served: a method that reads fused entries and got plain
    ones (a store too small for the run evicted them) is measured on something else than it asks for."""
    headers = ["method", "ratio", "n", "fused entries", "plain entries", "missed tokens"]
    table = []
    for (method, ratio), group in _by_run(records).items():
        hits = [r.get("variant_hits") or {} for r in group]
        table.append([method, ratio_cell(ratio), len(group), sum(h.get("fused", 0) for h in hits),
                      sum(h.get("plain", 0) for h in hits), sum(r.get("missed_tokens") or 0 for r in group)])  # fmt: skip
    return ("## Entries served\n\nChunk entries the requests read, by variant, and chunk tokens computed because "
            "their entry was missing. A method that reads fused entries but got plain ones here was measured "
            "on a store too small for the run (pass a larger `--store`).\n\n" + markdown_table(headers, table) + "\n")


def greedy_agreement_markdown(rows: list[dict]) -> str:
    lengths = list(rows[0]["shares"]) if rows else []
    headers = ["method", "ratio", "n", *(f"first {k}" for k in lengths), "whole answer"]
    table = [[r["method"], ratio_cell(r["ratio"]), r["questions"], *(fmt(r["shares"][k]) for k in lengths),
              fmt(r["whole"])] for r in rows]  # fmt: skip
    return ("## Greedy agreement by answer length\n\nShare of questions whose greedy answer begins with Full "
            "Attention's first k tokens; 'whole answer' is the greedy EM.\n\n" + markdown_table(headers, table) + "\n")


def partings_markdown(summary: dict | None) -> str:
    if summary is None:
        return ""
    headers = ["method", "ratio", "n", "answers that part", "FA near tie there", "FA margin there (median)",
               "method's own gap there (median)"]  # fmt: skip
    table = [[r["method"], ratio_cell(r["ratio"]), r["questions"], r["parted"], fmt(r["near_tie_share"]),
              fmt(r["fa_margin_median"], 3), fmt(r["gap_median"], 3)] for r in summary["rows"]]  # fmt: skip
    return ("## Where greedy answers part\n\nAt the token where a method's greedy answer first differs from Full "
            "Attention's: Full Attention's top-1 minus top-2 probability there ('near tie': below "
            f"{summary['near_tie']:g}; {fmt(summary['fa_near_tie_share'])} of all of Full Attention's answer tokens "
            "are near ties), and the method's probability of its own token minus that of Full Attention's.\n\n"
            + markdown_table(headers, table) + "\n")  # fmt: skip


def plot_vs_ratio(rows: list[dict], metric: str, ylabel: str, path: Path, title: str) -> Path:
    """``metric`` against the recompute ratio, one line per method; ratio-free methods as flat lines."""
    with figure(path, figsize=(6.4, 4.2)) as (fig, ax):
        swept = [r["ratio"] for r in rows if r["ratio"] is not None]
        for method in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows if r["method"] == method and finite_number(r[metric])]
            if mine and mine[0]["ratio"] is None:
                ax.axhline(mine[0][metric], linestyle="--", linewidth=1.2, label=method, color=reference_colour(method))
            elif mine:
                ax.plot([r["ratio"] for r in mine], [r[metric] for r in mine], marker="o", label=method)
        if swept:
            ax.set_xlim(min(swept) - 0.02, max(swept) + 0.02)
        ax.set(xlabel="recompute ratio", ylabel=ylabel, title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return Path(path)


def plot_per_question(records: list[dict], path: Path, title: str) -> Path:
    """Per-question KL of every (method, ratio) as box plots with the points over them (log y)."""
    groups: dict[str, list[float]] = {}
    for record in records:
        if record["method"] != "full_attention":  # its KL is 0 by definition
            groups.setdefault(run_label(record["method"], record["ratio"]), []).append(max(record["kl"], 1e-6))
    with figure(path, figsize=(max(6.4, 0.7 * len(groups) + 2), 4.4)) as (fig, ax):
        if groups:
            ax.boxplot(list(groups.values()), showfliers=False)
            for i, values in enumerate(groups.values(), start=1):
                ax.scatter([i] * len(values), values, s=8, alpha=0.5)
            ax.set_xticks(range(1, len(groups) + 1), list(groups), rotation=30, ha="right", fontsize=8)
            ax.set_yscale("log")
        ax.set(ylabel="KL(FA || method) per question", title=title)
        ax.grid(alpha=0.3, axis="y")
    return Path(path)


def write_quality(out_dir: Path, config: dict, machine: dict, run: dict, records: list[dict],
                  rows: list[dict]) -> list[Path]:  # fmt: skip
    """quality.json, quality.md, quality_kl.png, quality_f1.png and quality_kl_per_question.png in
    ``out_dir``; the JSON and the table include the per-question diagnostics."""
    out_dir = Path(out_dir)
    spread, agreement, parts = distribution(records), greedy_agreement(records), partings(records)
    data = {"config": config, "machine": machine, "run": run, "aggregates": rows, "distribution": spread,
            "greedy_agreement": agreement, "partings": parts, "per_question": per_question(records),
            "records": records}  # fmt: skip
    markdown = "\n".join([quality_markdown(rows, config, machine), distribution_markdown(spread),
                          greedy_agreement_markdown(agreement), partings_markdown(parts),
                          served_markdown(records)])  # fmt: skip
    title = f"{config['model']}, {len({r['qid'] for r in records})} questions"
    return [*write_report(out_dir, "quality", data, markdown),
            plot_vs_ratio(rows, "kl", "mean KL(FA || method)", out_dir / "quality_kl.png", title),
            plot_vs_ratio(rows, "f1", "F1 vs gold answers", out_dir / "quality_f1.png", title),
            plot_per_question(records, out_dir / "quality_kl_per_question.png", title)]  # fmt: skip
