"""Does a probe (a few tokens per chunk recomputed over the fused cache) tell which variant is closer to
the exact KV at the upper layers?  python docs/results/musique-smollm2-heldout-probe/probe_signal.py SKIP LIMIT OUT.json STORE [STRIDE]  (from the repository root)"""
import sys, json, torch
from fusionrag_llm.eval.bench_data import load_examples, open_bench_rag, chunk_texts
from fusionrag_llm.engine.methods import plan_run
from fusionrag_llm import RAGRequest
torch.set_grad_enabled(False)
rag = open_bench_rag('smollm2-135m', None, None, sys.argv[4], 4.0, 40)
stride = int(sys.argv[5]) if len(sys.argv) > 5 else 8
eng, model = rag.engine, rag.engine.model
L = model.cfg.num_layers
U = slice(L // 2, L)
out = []
def dev_rows(ak, av, bk, bv, rows):  # per layer, mean over rows
    return ((ak[:, :, rows].float() - bk[:, :, rows].float()).pow(2).sum(dim=(1, 3)).mean(1)
            + (av[:, :, rows].float() - bv[:, :, rows].float()).pow(2).sum(dim=(1, 3)).mean(1))
for ex in load_examples('../shared/data/musique_dev.json', int(sys.argv[2]), 10, 0, skip=int(sys.argv[1])):
    segs = rag.segments(RAGRequest(chunks=chunk_texts(ex), question=ex.question))
    caches = {}
    for name in ('fusionrag', 'full_reuse'):
        seq = eng._sequence(segs, plan_run(name, 0.0), 1); w = eng._assemble(seq); caches[name] = seq.cache; layout = w.resolved.layout
    F, P = caches['fusionrag'], caches['full_reuse']
    n = F.length
    exact = model.new_cache(n); every = exact.reserve(n)
    model(layout.step(every, logit_rows=every[:0]), exact)
    fk, fv = F.keys.clone(), F.values.clone()
    spans = layout.chunk_spans
    probe = torch.cat([torch.arange(s, e)[::stride] for s, e in spans] + [layout.fresh_slots]).sort().values
    model(layout.step(probe, logit_rows=probe[:0]), F)
    nk, nv = F.keys, F.values
    for ci, (s, e) in enumerate(spans):
        if ci == 0: continue
        rows = torch.arange(s, e)
        prow = rows[::stride]
        f = dev_rows(fk, fv, exact.keys, exact.values, rows)
        p = dev_rows(P.keys, P.values, exact.keys, exact.values, rows)
        pf = dev_rows(nk, nv, fk, fv, prow)
        pp = dev_rows(nk, nv, P.keys, P.values, prow)
        out.append(dict(q=ex.id, c=ci, f=f.tolist(), p=p.tolist(), pf=pf.tolist(), pp=pp.tolist()))
    print(ex.id, flush=True)
json.dump(out, open(sys.argv[3], 'w'))
