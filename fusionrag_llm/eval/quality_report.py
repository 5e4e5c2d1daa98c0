"""Aggregates, normalised scores, table and plots of the quality benchmark.

Means are taken per (method, ratio) over the questions of the run. Normalised scores follow eq. 11
of the FusionRAG paper on those means, with Full Reuse at 0 and Full Attention at 1 from the same
run: ``norm_f1`` on F1, ``norm_em`` on EM, and two normalised fidelities: ``norm_kl`` on the mean
KL (Full Attention's KL is 0, so it is ``1 - KL / KL_full_reuse``) and ``norm_first_token`` on the
first-token agreement (Full Attention's is 1). A score whose two baselines coincide is 1.0 when the
method matches them too, else undefined (``null`` in JSON, ``-`` in tables).
"""

from __future__ import annotations

import math
from pathlib import Path

from fusionrag_llm.eval.bench_methods import jobs
from fusionrag_llm.eval.metrics import normalized_score
from fusionrag_llm.eval.plots import plot_vs_ratio
from fusionrag_llm.eval.quality_diagnostics import (distribution, distribution_markdown, greedy_agreement,
                                                    greedy_agreement_markdown, partings, partings_markdown,
                                                    per_question, plot_per_question)
from fusionrag_llm.eval.results import fmt, markdown_table, mean, ms, write_json

MEAN_FIELDS = ("f1", "em", "first_token", "greedy_em", "kl", "ttft_s", "load_s", "select_s", "prefill_s",
               "prompt_tokens", "recomputed_tokens", "computed_tokens")  # fmt: skip
NORMALISED = {"norm_f1": "f1", "norm_em": "em", "norm_kl": "kl", "norm_first_token": "first_token"}


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
    baseline = {row["method"]: row for row in rows if row["method"] in ("full_attention", "full_reuse")}
    for row in rows:
        for name, source in NORMALISED.items():
            row[name] = _normalised(row[source], baseline["full_reuse"][source], baseline["full_attention"][source])
    return rows


def _normalised(x: float, full_reuse: float, full_attention: float) -> float:
    if any(math.isnan(v) for v in (x, full_reuse, full_attention)):
        return math.nan
    return normalized_score(x, full_reuse, full_attention, tol=1e-12)


def quality_markdown(rows: list[dict], config: dict, machine: dict) -> str:
    headers = ["method", "ratio", "n", "F1", "EM", "norm F1", "KL(FA‖m)", "norm KL", "first tok", "norm first",
               "greedy EM", "TTFT ms", "recomputed"]  # fmt: skip
    table = [
        [row["method"], "-" if row["ratio"] is None else f"{row['ratio']:g}", row["questions"], fmt(row["f1"]),
         fmt(row["em"]), fmt(row["norm_f1"]), fmt(row["kl"], 4), fmt(row["norm_kl"]), fmt(row["first_token"]),
         fmt(row["norm_first_token"]), fmt(row["greedy_em"]), ms(row["ttft_s"]), fmt(row["recomputed_tokens"], 1)]
        for row in rows
    ]  # fmt: skip
    head = (f"# Quality: {config['model']} on {Path(config['dataset']).name}\n\n"
            f"{rows[0]['questions'] if rows else 0} questions{_skipped(config)} x {config['passages']} passages, neighbors={config['neighbors']}, "
            f"max_new_tokens={config['max_new_tokens']}; "
            f"{machine['platform']}, {machine['cpu_count']} CPUs, torch {machine['torch']}, "
            f"{machine.get('device')} {machine.get('dtype')}.\n\n"
            "Ratio '-': the method does not depend on it. norm = eq. 11 (Full Reuse 0, Full Attention 1).\n\n")  # fmt: skip
    return head + markdown_table(headers, table) + "\n"


def _skipped(config: dict) -> str:
    return f" (after the first {config['skip']})" if config.get("skip") else ""


def write_quality(out_dir: Path, config: dict, machine: dict, run: dict, records: list[dict],
                  rows: list[dict]) -> list[Path]:  # fmt: skip
    """quality.json, quality.md, quality_kl.png, quality_f1.png and quality_kl_per_question.png in
    ``out_dir``; the JSON and the table include the per-question diagnostics."""
    out_dir = Path(out_dir)
    spread, agreement, parts = distribution(records), greedy_agreement(records), partings(records)
    data = {"config": config, "machine": machine, "run": run, "aggregates": rows, "distribution": spread,
            "greedy_agreement": agreement, "partings": parts, "per_question": per_question(records),
            "records": records}  # fmt: skip
    paths = [write_json(out_dir / "quality.json", data)]
    (out_dir / "quality.md").write_text(quality_markdown(rows, config, machine) + "\n" + distribution_markdown(spread)
                                        + "\n" + greedy_agreement_markdown(agreement) + "\n"
                                        + partings_markdown(parts))  # fmt: skip
    paths.append(out_dir / "quality.md")
    title = f"{config['model']}, {len({r['qid'] for r in records})} questions"
    paths.append(plot_vs_ratio(rows, "kl", "mean KL(FA || method)", out_dir / "quality_kl.png", title))
    paths.append(plot_vs_ratio(rows, "f1", "F1 vs gold answers", out_dir / "quality_f1.png", title))
    paths.append(plot_per_question(records, out_dir / "quality_kl_per_question.png", title))
    return paths
