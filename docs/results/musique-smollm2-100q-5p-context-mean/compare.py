"""The context-mean run against the default's records on the same questions.

    python compare.py RUN_LOG_OR_QUALITY_JSON docs/results/musique-smollm2-100q-5p-kv-shift/quality.json

RUN: the context-mean run (its ``fusionrag`` records, Full Attention's and Full Reuse's); BASE: the
kv_shift run, whose ``fusionrag~0.5`` is the default ``fusionrag`` on the engine's own fused entries.
Only questions the run answered at every ratio are compared."""
import json
import statistics as st
import sys

from fusionrag_llm.eval.metrics import parting_position
from fusionrag_llm.eval.quality_diagnostics import HARM_TOLERANCE

DEFAULT, MEAN = "the engine's (default)", "mean over contexts"


def records(path):
    if path.endswith(".jsonl"):
        return [json.loads(line) for line in open(path) if '"qid"' in line]
    return json.load(open(path))["records"]


def table(run, base):
    by = {}
    for label, recs in ((MEAN, run), (DEFAULT, base)):
        for r in recs:
            method = {"fusionrag~0.5": "fusionrag"}.get(r["method"], r["method"]) if label == DEFAULT else r["method"]
            by.setdefault((label, method, r["ratio"]), {})[r["qid"]] = r
    ratios = sorted({k[2] for k in by if k[0] == MEAN and k[1] == "fusionrag"})
    qids = set.intersection(*(set(by[(MEAN, "fusionrag", r)]) for r in ratios))
    fa, fr = by[(MEAN, "full_attention", None)], by[(MEAN, "full_reuse", None)]
    rows = ["| fused entries | r | n | mean KL | norm KL | median | p90 | max | > FR | FA answer lost vs FR | first 8 | greedy EM | vs default: closer / further |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for ratio in ratios:
        for label in (DEFAULT, MEAN):
            m = by[(label, "fusionrag", ratio)]
            q = sorted(qids, key=lambda s: int(s.rsplit("-", 1)[-1]))
            kl = sorted(m[x]["kl"] for x in q)
            norm = 1 - st.mean(kl) / st.mean(fr[x]["kl"] for x in q)
            worse = [x for x in q if m[x]["kl"] > fr[x]["kl"] + HARM_TOLERANCE]
            lost = sum(fr[x]["greedy_em"] == 1.0 and m[x]["greedy_em"] < 1.0 for x in q)
            vs = "-"
            if label == MEAN:
                b = by[(DEFAULT, "fusionrag", ratio)]
                vs = f"{sum(m[x]['kl'] < b[x]['kl'] - HARM_TOLERANCE for x in q)} / {sum(m[x]['kl'] > b[x]['kl'] + HARM_TOLERANCE for x in q)}"
            rows.append(f"| {label} | {ratio} | {len(q)} | {st.mean(kl):.4f} | {norm:.3f} | {st.median(kl):.4f} | "
                        f"{kl[int(0.9 * len(kl)) - 1]:.4f} | {kl[-1]:.4f} | {len(worse)} {', '.join(worse)} | {lost} | "
                        f"{st.mean(_through(parting_position(fa[x]['token_ids'], m[x]['token_ids']), 8) for x in q):.2f} | "
                        f"{st.mean(m[x]['greedy_em'] for x in q):.2f} | {vs} |")
    return "\n".join(rows)


def _through(parting, tokens):
    """Whether an answer starts with Full Attention's first ``tokens`` tokens (None: equal answers)."""
    return parting is None or parting >= tokens


if __name__ == "__main__":
    print(table(records(sys.argv[1]), records(sys.argv[2])))
