"""Compare quality runs question by question: an ablation against the default, one codec against another.

    python bench/compare_runs.py [NAME=]RUN [NAME=]RUN ... [--lines fusionrag@0.15,cacheblend@0.15] [--out DIR]

A RUN is a ``fusionrag bench quality`` output folder (its quality.json, or its quality.partial.jsonl
while the run is still going) or one of those files. Only the questions every run has answered on
every line are kept. A line is ``method@ratio`` (a baseline: ``method``); default: every line of the
first run but Full Attention. Per run and line: mean, median, p90 and max KL(FA || method); norm KL
(1 - KL / the run's Full Reuse KL); questions further from Full Attention than Full Reuse by more
than the diagnostics' tolerance; questions where Full Reuse kept Full Attention's greedy answer and
the line did not; the share of answers that begin with Full Attention's first k tokens (k = 1, 4, 8)
and whole (greedy EM); and, against the first run's same line, the questions it is closer to / further
from Full Attention on. Writes comparison.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fusionrag_llm.eval.metrics import parting_position
from fusionrag_llm.eval.quality_report import HARM_TOLERANCE
from fusionrag_llm.eval.results import fmt, markdown_table

# the test fills {quality_run} with a small quality run of the tiny model
TINY_ARGS = ["{quality_run}", "again={quality_run}"]
PREFIXES = (1, 4, 8)
Records = dict[tuple[str, float | None], dict[str, dict]]  # line -> question id -> record


def load(path: Path) -> Records:
    """A run's records by line and question."""
    if path.is_dir():
        done = path / "quality.json"
        path = done if done.exists() else path / "quality.partial.jsonl"
    if path.suffix == ".jsonl":
        lines = path.read_text().splitlines()
        records = [json.loads(line) for line in lines if line.endswith("}") and '"qid"' in line]
    else:
        records = json.loads(path.read_text())["records"]
    found: Records = {}
    for record in records:
        found.setdefault((record["method"], record["ratio"]), {})[record["qid"]] = record
    return found


def line_of(text: str) -> tuple[str, float | None]:
    method, at, ratio = text.partition("@")
    return method, float(ratio) if at else None


def label(line: tuple[str, float | None]) -> str:
    return line[0] if line[1] is None else f"{line[0]}@{line[1]:g}"


def common_questions(runs: dict[str, Records], lines: list) -> list[str]:
    needed = [("full_attention", None), ("full_reuse", None), *lines]
    sets = [set(run.get(line, {})) for run in runs.values() for line in needed]
    return sorted(set.intersection(*sets))


def summary(run: Records, line, questions: list[str]) -> dict:
    mine, fa, fr = run[line], run[("full_attention", None)], run[("full_reuse", None)]
    kls = sorted(mine[q]["kl"] for q in questions)
    fr_kl = statistics.fmean(fr[q]["kl"] for q in questions)
    parts = [parting_position(fa[q]["token_ids"], mine[q]["token_ids"]) for q in questions]
    return {
        "kl": {q: mine[q]["kl"] for q in questions},
        "mean": statistics.fmean(kls), "median": statistics.median(kls), "p90": kls[int(0.9 * (len(kls) - 1))],
        "max": kls[-1], "norm": 1 - statistics.fmean(kls) / fr_kl if fr_kl > 0 else float("nan"),
        "worse": sum(mine[q]["kl"] > fr[q]["kl"] + HARM_TOLERANCE for q in questions),
        "lost": sum(fr[q]["greedy_em"] == 1.0 and mine[q]["greedy_em"] < 1.0 for q in questions),
        "first": [sum(p is None or p >= k for p in parts) / len(questions) for k in PREFIXES],
        "whole": sum(p is None for p in parts) / len(questions),
    }  # fmt: skip


def compare(runs: dict[str, Records], lines: list) -> str:
    questions = common_questions(runs, lines)
    if not questions:
        raise SystemExit("no question has a record on every line of every run")
    base = next(iter(runs))
    rows = []
    for line in lines:
        reference = summary(runs[base], line, questions)
        for name, run in runs.items():
            s = summary(run, line, questions)
            closer = sum(s["kl"][q] < reference["kl"][q] - HARM_TOLERANCE for q in questions)
            further = sum(s["kl"][q] > reference["kl"][q] + HARM_TOLERANCE for q in questions)
            rows.append([name, label(line), fmt(s["mean"], 4), fmt(s["norm"]), fmt(s["median"], 4), fmt(s["p90"], 4),
                         fmt(s["max"], 4), s["worse"], s["lost"], *(fmt(x, 2) for x in s["first"]), fmt(s["whole"], 2),
                         "-" if name == base else f"{closer} / {further}"])  # fmt: skip
    headers = ["run", "line", "mean KL", "norm KL", "median", "p90", "max", "> FR", "FA answer lost vs FR",
               *(f"first {k}" for k in PREFIXES), "greedy EM", f"vs {base}: closer / further"]  # fmt: skip
    return f"{len(questions)} questions answered by every run on every line.\n\n" + markdown_table(headers, rows) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", metavar="[NAME=]RUN", help="quality run folders or files; the first is the base")
    p.add_argument("--lines", default=None, help="comma-separated method@ratio (default: the first run's)")
    p.add_argument("--out", default="bench_results")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    runs = {}
    for index, spec in enumerate(args.runs):
        name, eq, path = spec.rpartition("=")
        runs[name if eq else f"run {index + 1}"] = load(Path(path))
    first = next(iter(runs.values()))
    lines = [line_of(t) for t in args.lines.split(",")] if args.lines else [
        line for line in first if line != ("full_attention", None)]  # fmt: skip
    table = compare(runs, lines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(table)
    print(table + f"wrote {out / 'comparison.md'}")


if __name__ == "__main__":
    main()
