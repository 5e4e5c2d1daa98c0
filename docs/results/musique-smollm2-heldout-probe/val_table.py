"""Per question: Full Reuse, the paper's policy and the probe policy at r = 0.15, from a bench log."""
import json, sys, statistics as st
recs = [json.loads(l) for l in open(sys.argv[1])][1:]
skip = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else set()
by = {(r["qid"], r["method"], r["ratio"]): r for r in recs}
qs = sorted({r["qid"] for r in recs if r["method"] == "fusionrag:probe" and r["ratio"] == 0.15} - skip, key=lambda s: int(s.split("-")[1]))
rows = []
for q in qs:
    fr, pa, pr = by[(q, "full_reuse", None)], by[(q, "fusionrag", 0.15)], by[(q, "fusionrag:probe", 0.15)]
    rows.append((q, fr["kl"], pa["kl"], pr["kl"], pr.get("fused_declined", 0), pa["greedy_em"], pr["greedy_em"], fr["greedy_em"], pa["first_token"], pr["first_token"]))
    print(f"| {q} | {fr['kl']:.4f} | {pa['kl']:.4f} | {pr['kl']:.4f} | {pr.get('fused_declined', 0)} | {pa['greedy_em']:.0f} / {pr['greedy_em']:.0f} |")
n = len(rows)
def agg(i): v = [r[i] for r in rows]; return f"mean {st.mean(v):.4f} median {st.median(v):.4f} max {max(v):.4f}"
print(n, "questions")
print("full_reuse", agg(1)); print("paper", agg(2)); print("probe", agg(3))
frm = st.mean(r[1] for r in rows)
print("norm KL paper %.3f probe %.3f" % (1 - st.mean(r[2] for r in rows) / frm, 1 - st.mean(r[3] for r in rows) / frm))
print("worse than FR: paper %d probe %d" % (sum(r[2] > r[1] for r in rows), sum(r[3] > r[1] for r in rows)))
print("probe vs paper: better %d worse %d (by >1e-4), worst loss %.4f" % (sum(r[3] < r[2] - 1e-4 for r in rows), sum(r[3] > r[2] + 1e-4 for r in rows), max(r[3] - r[2] for r in rows)))
print("greedy EM paper %.2f probe %.2f FR %.2f; FA answer lost where FR kept it: paper %d probe %d" % (
    st.mean(r[5] for r in rows), st.mean(r[6] for r in rows), st.mean(r[7] for r in rows),
    sum(r[7] == 1 and r[5] == 0 for r in rows), sum(r[7] == 1 and r[6] == 0 for r in rows)))
print("first token paper %.2f probe %.2f" % (st.mean(r[8] for r in rows), st.mean(r[9] for r in rows)))
print("chunks declined: total %d over %d questions" % (sum(r[4] for r in rows), sum(r[4] > 0 for r in rows)))
