import json, sys
rows = json.load(open(sys.argv[1]))
L = len(rows[0]['f']); U = range(L // 2, L)
agree = tot = 0; s_f = s_p = s_or = s_pr = 0.0; plain_oracle = plain_probe = caught = 0
for r in rows:
    f = sum(r['f'][i] for i in U); p = sum(r['p'][i] for i in U)
    pf = sum(r['pf'][i] for i in U); pp = sum(r['pp'][i] for i in U)
    o_plain, pr_plain = p < f, pp < pf
    agree += o_plain == pr_plain; tot += 1
    plain_oracle += o_plain; plain_probe += pr_plain; caught += o_plain and pr_plain
    s_f += f; s_p += p; s_or += min(f, p); s_pr += p if pr_plain else f
print(f"chunks {tot}; oracle says plain closer on {plain_oracle}; probe chooses plain on {plain_probe}, of which right {caught}; agreement {agree/tot:.2f}")
print(f"summed upper-layer distance: always fused {s_f:.1f}, always plain {s_p:.1f}, oracle {s_or:.1f}, probe {s_pr:.1f}")
