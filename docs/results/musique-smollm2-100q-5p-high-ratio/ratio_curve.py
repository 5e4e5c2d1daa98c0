"""Greedy agreement and KL of `fusionrag` against its recompute ratio, 0 to 0.7, on the questions
that have every record, with bfloat16 Full Attention for scale.

    python ratio_curve.py KV_SHIFT_QUALITY_JSON HIGH_RATIO_PARTIAL_LOG FA_BF16_JSONL

The first file holds Full Attention, Full Reuse and `fusionrag~0.5` (the default) at r = 0 ... 0.3;
the log, `fusionrag` at r = 0.5 and 0.7 (the same Full Attention and Full Reuse records seeded it);
the last, `bf16_floor.py`'s bfloat16 Full Attention answers.
"""

import json
import statistics
import sys

from fusionrag_llm.eval.metrics import normalized_score, parting_position
from fusionrag_llm.eval.quality_diagnostics import HARM_TOLERANCE
from fusionrag_llm.eval.results import fmt, markdown_table


def main(shift_json: str, high_log: str, bf16_jsonl: str) -> None:
    runs: dict[str, dict[str, dict]] = {}
    for r in json.load(open(shift_json))["records"]:
        if r["method"] in ("full_attention", "full_reuse") or r["method"] == "fusionrag~0.5":
            runs.setdefault(_label(r), {})[r["qid"]] = r
    for line in open(high_log):
        r = json.loads(line)
        if r.get("method") == "fusionrag":
            runs.setdefault(_label(r), {})[r["qid"]] = r
    runs["full_attention (bfloat16)"] = {r["qid"]: dict(r, kl=None) for r in map(json.loads, open(bf16_jsonl))}
    qids = set.intersection(*(set(q) for q in runs.values()))
    fa, fr = runs["full_attention"], runs["full_reuse"]
    fr_kl = statistics.mean(fr[q]["kl"] for q in qids)
    rows = []
    for label, mine in runs.items():
        if label == "full_attention":
            continue
        kls = [mine[q]["kl"] for q in qids] if mine[next(iter(qids))]["kl"] is not None else None
        parts = [parting_position(fa[q]["token_ids"], mine[q]["token_ids"]) for q in qids]
        rows.append([label, "-" if kls is None else fmt(statistics.mean(kls), 4),
                     "-" if kls is None else fmt(normalized_score(statistics.mean(kls), fr_kl, 0.0)),
                     "-" if kls is None else fmt(max(kls), 3),
                     "-" if kls is None else sum(mine[q]["kl"] > fr[q]["kl"] + HARM_TOLERANCE for q in qids),
                     *(fmt(sum(p is None or p >= k for p in parts) / len(qids), 2) for k in (1, 4, 8, 12)),
                     fmt(sum(p is None for p in parts) / len(qids), 2)])  # fmt: skip
    print(f"{len(qids)} questions\n")
    print(markdown_table(["method", "mean KL", "norm KL", "max KL", "> FR", "first 1", "first 4", "first 8",
                          "first 12", "whole (greedy EM)"], rows))  # fmt: skip


def _label(record: dict) -> str:
    method = "fusionrag" if record["method"] == "fusionrag~0.5" else record["method"]
    return method if record["ratio"] is None else f"{method} r={record['ratio']:g}"


if __name__ == "__main__":
    main(*sys.argv[1:4])
