"""Per chunk of each prompt: how far its fused and plain entries are from the prompt's exact KV, layer by
layer, and from each other; plus the share of its fusion neighbours that are in the prompt.

    python variant_signals.py SKIP LIMIT OUT.json STORE   (from the repository root; STORE: the bench's --store)

Writes one row per chunk but the first: f = fused vs
exact, p = plain vs exact, fp = fused vs plain (mean over the chunk's tokens of the squared key and
value distance, summed over heads), one value per layer."""
import sys, json, torch
from fusionrag_llm.eval.bench_data import load_examples, open_bench_rag, chunk_texts
from fusionrag_llm.engine.methods import plan_run
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm import RAGRequest
rag = open_bench_rag('smollm2-135m', None, None, sys.argv[4], 4.0, 40)
eng, model = rag.engine, rag.engine.model
L = model.cfg.num_layers
out = []
for ex in load_examples('../shared/data/musique_dev.json', int(sys.argv[2]), 10, 0, skip=int(sys.argv[1])):
    segs = rag.segments(RAGRequest(chunks=chunk_texts(ex), question=ex.question))
    caches = {}
    for name in ('fusionrag', 'full_reuse'):
        seq = eng._sequence(segs, plan_run(name, 0.0), 1); w = eng._assemble(seq); caches[name] = seq.cache; layout = w.resolved.layout
    ids_in = {chunk_id_of(s.text) for s in segs if s.kind == 'chunk'}
    n = caches['fusionrag'].length
    exact = model.new_cache(n); every = exact.reserve(n)
    model(layout.step(every, logit_rows=every[:0]), exact)
    F, P = caches['fusionrag'], caches['full_reuse']
    def dev(a, b, s, e):
        return ((a.keys[:, :, s:e].float() - b.keys[:, :, s:e].float()).pow(2).sum(dim=(1, 3)).mean(1)
                + (a.values[:, :, s:e].float() - b.values[:, :, s:e].float()).pow(2).sum(dim=(1, 3)).mean(1))
    chunks = [s for s in segs if s.kind == 'chunk']
    for ci, ((s, e), seg) in enumerate(zip(layout.chunk_spans, chunks)):
        if ci == 0: continue
        f, p, fp = dev(F, exact, s, e), dev(P, exact, s, e), dev(F, P, s, e)
        entry, _ = rag.parts.entries.lookup(tuple(seg.token_ids), 'fused')
        nb = entry.meta.get('neighbours') or []
        overlap = sum(x in ids_in for x in nb) / max(1, len(nb))
        out.append(dict(q=ex.id, c=ci, f=f.tolist(), p=p.tolist(), fp=fp.tolist(), overlap=overlap))
    print(ex.id, flush=True)
json.dump(out, open(sys.argv[3], 'w'))
