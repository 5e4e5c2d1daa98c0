"""`variant_policy=blend` against the paper's policy ("always"), per question. Arguments: the bench's
quality.json files or quality.partial.jsonl logs holding both (the first file's record wins).
An optional first argument `--pairs=BASE@R:OTHER@R,...` names other (method, ratio) pairs to compare,
e.g. `--pairs=fusionrag_paper@0.15:fusionrag@0.15`."""
import json
import statistics as st
import sys

args = sys.argv[1:]
pairs = [(("fusionrag", 0.0), ("fusionrag:blend", 0.0)), (("fusionrag", 0.15), ("fusionrag:blend", 0.15)),
         (("fused+query_guided_layers", 0.15), ("fused+query_guided_layers:blend", 0.15))]
if args and args[0].startswith("--pairs="):
    def cell(text):
        method, _, ratio = text.rpartition("@")
        return method, float(ratio)
    pairs = [tuple(cell(side) for side in pair.split(":", 1)) for pair in args.pop(0)[len("--pairs="):].split(",")]
recs = {}
for path in args:
    lines = open(path).read().splitlines()
    records = [json.loads(line) for line in lines if '"qid"' in line] if path.endswith(".jsonl") else json.load(open(path))["records"]
    for r in records:
        recs.setdefault((r["method"], r["ratio"]), {}).setdefault(r["qid"], r)
fr = recs[("full_reuse", None)]
print("| method | r | mean KL | norm KL | median | p90 | max | > FR | FA answer lost vs FR | greedy EM | vs base: closer / further |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for base, blend in pairs:
    if blend not in recs:
        continue
    for key in (base, blend):
        m = recs[key]
        q = sorted(m)
        kl = sorted(m[x]["kl"] for x in q)
        norm = 1 - st.mean(kl) / st.mean(fr[x]["kl"] for x in q)
        worse = [x for x in q if m[x]["kl"] > fr[x]["kl"] + 1e-4]
        lost = sum(1 for x in q if fr[x]["greedy_em"] == 1.0 and m[x]["greedy_em"] < 1.0)
        vs = "-"
        if key == blend:
            b = recs[base]
            vs = f"{sum(m[x]['kl'] < b[x]['kl'] - 1e-4 for x in q)} / {sum(m[x]['kl'] > b[x]['kl'] + 1e-4 for x in q)}"
        print(f"| {key[0]} | {key[1]} | {st.mean(kl):.4f} | {norm:.3f} | {st.median(kl):.4f} | {kl[int(0.9 * len(kl)) - 1]:.4f} | "
              f"{kl[-1]:.4f} | {len(worse)} {', '.join(worse)} | {lost} | {st.mean(m[x]['greedy_em'] for x in q):.2f} | {vs} |")
