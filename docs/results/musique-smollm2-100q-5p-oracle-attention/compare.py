import json, statistics as st, sys
d = json.load(open(sys.argv[1]))
recs = {}
for r in d["records"]:
    recs.setdefault((r["method"], r["ratio"]), {})[r["qid"]] = r
fr = recs[("full_reuse", None)]
rows = []
for key in sorted(k for k in recs if k[1] is not None):
    m = recs[key]; q = [x for x in m if x in fr]
    kl = [m[x]["kl"] for x in q]; frkl = [fr[x]["kl"] for x in q]
    worse = [x for x in q if m[x]["kl"] > fr[x]["kl"] + 1e-4]
    lost = sum(1 for x in q if fr[x]["greedy_em"] == 1.0 and m[x]["greedy_em"] < 1.0)
    print(f"{key[0]} r={key[1]} n={len(q)} mean KL {st.mean(kl):.4f} norm {1 - st.mean(kl)/st.mean(frkl):.3f} median {st.median(kl):.4f} "
          f"p90 {sorted(kl)[int(0.9*len(kl))-1]:.4f} max {max(kl):.4f} >FR {len(worse)} {worse} lost {lost} greedyEM {st.mean(m[x]['greedy_em'] for x in q):.2f} "
          f"TTFT median {st.median(m[x]['ttft_s'] for x in q)*1e3:.0f} ms")
a, b = recs.get(("fused+query_guided_layers", 0.15)), recs.get(("fused+query_guided_two_stage", 0.15))
if a and b:
    q = [x for x in a if x in b]
    closer = sum(b[x]["kl"] < a[x]["kl"] - 1e-4 for x in q); further = sum(b[x]["kl"] > a[x]["kl"] + 1e-4 for x in q)
    print(f"two_stage vs layers: closer {closer} further {further} of {len(q)}; worst increase {max(b[x]['kl'] - a[x]['kl'] for x in q):.4f}")
