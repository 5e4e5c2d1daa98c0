"""Compare quality runs made with different fused-entry layouts (``fusionrag bench quality --fused-order``).

Usage: python compare_layouts.py LAYOUT=RUN_FOLDER ... > comparison.md
Reads each folder's quality.json (or, for a run still going, its quality.partial.jsonl) and keeps the
questions every run has answered with every method; per layout and ratio: fusionrag's mean, median and max KL(FA || method),
questions further from Full Attention than Full Reuse (by more than 1e-4), greedy agreement with Full
Attention, and per question how the layout compares with the first one given.
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


def summary(records: dict, ratio) -> dict:
    kl = {q: r["kl"] for (m, ra, q), r in records.items() if m == "fusionrag" and ra == ratio}
    fr = {q: r["kl"] for (m, _, q), r in records.items() if m == "full_reuse"}
    greedy = [r["greedy_em"] for (m, ra, _), r in records.items() if m == "fusionrag" and ra == ratio]
    first = [r["first_token"] for (m, ra, _), r in records.items() if m == "fusionrag" and ra == ratio]
    values = sorted(kl.values())
    return {"kl": kl, "mean": statistics.fmean(values), "median": statistics.median(values), "max": values[-1],
            "p90": values[int(0.9 * (len(values) - 1))], "worse_than_fr": sum(kl[q] > fr[q] + WORSE for q in kl),
            "fr_mean": statistics.fmean(fr.values()), "greedy": statistics.fmean(greedy),
            "first_token": statistics.fmean(first), "n": len(values)}


def main(pairs: list[str]) -> None:
    runs = common({name: load(folder) for name, folder in (p.split("=", 1) for p in pairs)})
    base = next(iter(runs))
    print("| layout | r | mean KL | median KL | p90 KL | max KL | > FR | greedy EM vs FA | first token | "
          f"vs {base}: closer / further |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for ratio in (0.0, 0.15):
        reference = summary(runs[base], ratio)
        for name, records in runs.items():
            s = summary(records, ratio)
            closer = sum(s["kl"][q] < reference["kl"][q] - WORSE for q in s["kl"])
            further = sum(s["kl"][q] > reference["kl"][q] + WORSE for q in s["kl"])
            versus = "-" if name == base else f"{closer} / {further}"
            print(f"| {name} | {ratio:g} | {s['mean']:.4f} | {s['median']:.4f} | {s['p90']:.4f} | {s['max']:.4f} | "
                  f"{s['worse_than_fr']}/{s['n']} | {s['greedy']:.2f} | {s['first_token']:.2f} | {versus} |")
    fr = summary(runs[base], 0.0)
    print(f"\nFull Reuse (plain entries, the same in every run): mean KL {fr['fr_mean']:.4f}.")


if __name__ == "__main__":
    main(sys.argv[1:])
