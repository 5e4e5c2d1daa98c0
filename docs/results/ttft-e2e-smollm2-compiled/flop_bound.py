"""Positions fusionrag r=0.15 recomputes on a 10-passage question (the 31st of the MuSiQue file), and the
FLOP ratio of each sorted pass to Full Attention.

    python flop_bound.py [DATASET (default ../shared/data/musique_dev.json)] [STORE (default :memory:)]
"""
import sys

import torch
from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.eval.datasets import load_musique
from fusionrag_llm.eval.bench_quality import chunk_texts
from fusionrag_llm.models import attention as A
torch.set_num_threads(2)
dataset = sys.argv[1] if len(sys.argv) > 1 else "../shared/data/musique_dev.json"
ex = load_musique(dataset, skip=30, limit=1, passages=10)[0]
rag = FusionRAG.from_pretrained("smollm2-135m", store=sys.argv[2] if len(sys.argv) > 2 else ":memory:")
req = RAGRequest(chunks=chunk_texts(ex), question=ex.question)
seen = []
orig = A.attend
def attend(q, keys, values, mask, tail, sorted_positions=None):
    if sorted_positions is not None and len(seen) < 31 and (not seen or len(sorted_positions) != len(seen[-1])):
        seen.append(sorted_positions.clone())
    return orig(q, keys, values, mask, tail, sorted_positions)
import fusionrag_llm.models.attention_backend as B
B.attend = attend
g = rag.generate(req, method="fusionrag", recompute_ratio=0.15, max_new_tokens=1)
cfg = rag.engine.model.cfg
L = g.stats.prompt_tokens
params = sum(p.numel() for n, p in rag.engine.model.named_parameters() if "layers" in n and p.dim() == 2)
per_pair = cfg.num_heads * cfg.head_dim * 4 * cfg.num_layers
for pos in seen:
    n = len(pos); s = int((pos + 1).sum())
    sparse = s * per_pair + 2 * params * n
    full = L * (L + 1) // 2 * per_pair + 2 * params * L
    print(f"prompt {L}, sorted pass: {n} queries, mean position {float(pos.float().mean()):.0f} ({float(pos.float().mean())/L:.2f} of the prompt)")
    print(f"attention GFLOP sparse {s*per_pair/1e9:.0f} vs full {L*(L+1)//2*per_pair/1e9:.0f}; linear GFLOP sparse {2*params*n/1e9:.0f} vs full {2*params*L/1e9:.0f}; FLOP ratio {full/sparse:.2f}x")
