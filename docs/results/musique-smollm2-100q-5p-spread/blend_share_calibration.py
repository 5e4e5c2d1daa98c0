"""Per layer: the fused share w that brings w*F + (1-w)*P closest to the prompt's exact KV (pooled over
chunks and tokens), K and V separately, from the repository root:
    python blend_share_calibration.py SKIP LIMIT PASSAGES STORE OUT.json   (STORE: the bench's --store)"""
import sys, json, torch
from fusionrag_llm.eval.bench_data import load_examples, open_bench_rag, chunk_texts
from fusionrag_llm.engine.methods import plan_run
from fusionrag_llm import RAGRequest
skip, limit, passages, store, outp = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
rag = open_bench_rag('smollm2-135m', None, None, store, 4.0, 40)
eng, model = rag.engine, rag.engine.model
L = model.cfg.num_layers
num = {"k": torch.zeros(L, dtype=torch.float64), "v": torch.zeros(L, dtype=torch.float64)}
den = {"k": torch.zeros(L, dtype=torch.float64), "v": torch.zeros(L, dtype=torch.float64)}
per_q = []
for ex in load_examples('../shared/data/musique_dev.json', limit, passages, 0, skip=skip):
    segs = rag.segments(RAGRequest(chunks=chunk_texts(ex), question=ex.question))
    caches = {}
    for name in ('fusionrag_paper', 'full_reuse'):
        seq = eng._sequence(segs, plan_run(name, 0.0), 1); w = eng._assemble(seq); caches[name] = seq.cache; layout = w.resolved.layout
    n = caches['fusionrag_paper'].length
    exact = model.new_cache(n); every = exact.reserve(n)
    model(layout.step(every, logit_rows=every[:0]), exact)
    F, P = caches['fusionrag_paper'], caches['full_reuse']
    slots = layout.reused_slots
    qn = {"k": torch.zeros(L, dtype=torch.float64), "v": torch.zeros(L, dtype=torch.float64)}
    qd = {"k": torch.zeros(L, dtype=torch.float64), "v": torch.zeros(L, dtype=torch.float64)}
    for kind, attr in (("k", "keys"), ("v", "values")):
        f, p, e = (getattr(c, attr)[:, :, slots].double() for c in (F, P, exact))
        fp, ep = f - p, e - p
        qn[kind] += (ep * fp).sum(dim=(1, 2, 3)); qd[kind] += (fp * fp).sum(dim=(1, 2, 3))
        num[kind] += qn[kind]; den[kind] += qd[kind]
    per_q.append({"q": ex.id, **{k: (qn[k] / qd[k]).tolist() for k in qn}})
    print(ex.id, [round(x, 2) for x in (qn["k"] / qd["k"]).tolist()], flush=True)
res = {k: (num[k] / den[k]).tolist() for k in num}
print("K", [round(x, 2) for x in res["k"]]); print("V", [round(x, 2) for x in res["v"]])
json.dump({"pooled": res, "per_question": per_q}, open(outp, "w"))
