"""Compare quality runs made with different fused-entry layouts (``fusionrag bench quality --fused-order``).

Usage: python compare_layouts.py [--methods fusionrag,...] [--ratios 0,0.15] LAYOUT=RUN_FOLDER ... > comparison.md
Reads each folder's quality.json (or, for a run still going, its quality.partial.jsonl) and keeps the
questions every run has answered with every method; per layout, method and ratio: the mean, median,
p90 and max KL(FA || method), normalised KL (Full Reuse 0, Full Attention 1), questions further from
Full Attention than Full Reuse (by more than 1e-4), questions where Full Reuse kept Full Attention's
greedy answer and the method did not, greedy agreement with Full Attention, and per question how the
layout compares with the first one given (same method and ratio).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

WORSE = 1e-4  # as docs/BENCHMARKS.md counts "> FR"


def load(folder: str) -> dict:
    done = Path(folder) / "quality.json"
    if done.exists():
        records = json.loads(done.read_text())["records"]
    else:
        lines = (Path(folder) / "quality.partial.jsonl").read_text().splitlines()[1:]  # after the config line
        records = [json.loads(line) for line in lines if line.endswith("}")]
    return {(r["method"], r["ratio"], r["qid"]): r for r in records}


def common(runs: dict) -> dict:
    """Each run's records of the questions that every run has answered with every method and ratio."""
    def complete(records):
        jobs = {(m, ra) for (m, ra, _) in records}
        return {q for (_, _, q) in records if all((m, ra, q) in records for m, ra in jobs)}
    questions = set.intersection(*(complete(records) for records in runs.values()))
    return {name: {k: r for k, r in records.items() if k[2] in questions} for name, records in runs.items()}


def summary(records: dict, method: str, ratio) -> dict:
    mine = {q: r for (m, ra, q), r in records.items() if m == method and ra == ratio}
    kl = {q: r["kl"] for q, r in mine.items()}
    fr = {q: r for (m, _, q), r in records.items() if m == "full_reuse"}
    values = sorted(kl.values())
    fr_mean = statistics.fmean(r["kl"] for r in fr.values())
    return {"kl": kl, "mean": statistics.fmean(values), "median": statistics.median(values), "max": values[-1],
            "p90": values[int(0.9 * (len(values) - 1))], "worse_than_fr": sum(kl[q] > fr[q]["kl"] + WORSE for q in kl),
            "lost": sum(fr[q]["greedy_em"] == 1.0 and r["greedy_em"] < 1.0 for q, r in mine.items()),
            "fr_mean": fr_mean, "norm": 1.0 - statistics.fmean(values) / fr_mean if fr_mean > 0 else float("nan"),
            "greedy": statistics.fmean(r["greedy_em"] for r in mine.values()),
            "first_token": statistics.fmean(r["first_token"] for r in mine.values()), "n": len(values)}


def main(args: list[str]) -> None:
    methods, ratios = ["fusionrag"], [0.0, 0.15]
    while args and args[0].startswith("--"):
        flag, value, args = args[0], args[1], args[2:]
        if flag == "--methods":
            methods = value.split(",")
        elif flag == "--ratios":
            ratios = [float(x) for x in value.split(",")]
        else:
            raise SystemExit(f"unknown option {flag}; allowed: --methods, --ratios")
    runs = common({name: load(folder) for name, folder in (p.split("=", 1) for p in args)})
    base = next(iter(runs))
    print("| layout | method | r | mean KL | norm KL | median KL | p90 KL | max KL | > FR | FA answer lost vs FR | "
          f"greedy EM vs FA | first token | vs {base}: closer / further |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for method in methods:
        for ratio in ratios:
            reference = summary(runs[base], method, ratio)
            for name, records in runs.items():
                s = summary(records, method, ratio)
                closer = sum(s["kl"][q] < reference["kl"][q] - WORSE for q in s["kl"])
                further = sum(s["kl"][q] > reference["kl"][q] + WORSE for q in s["kl"])
                versus = "-" if name == base else f"{closer} / {further}"
                print(f"| {name} | {method} | {ratio:g} | {s['mean']:.4f} | {s['norm']:.3f} | {s['median']:.4f} | "
                      f"{s['p90']:.4f} | {s['max']:.4f} | {s['worse_than_fr']}/{s['n']} | {s['lost']}/{s['n']} | "
                      f"{s['greedy']:.2f} | {s['first_token']:.2f} | {versus} |")
    fr = summary(runs[base], methods[0], ratios[0])
    print(f"\nFull Reuse (plain entries, the same in every run): mean KL {fr['fr_mean']:.4f}.")


if __name__ == "__main__":
    main(sys.argv[1:])
