"""How far below Full Attention fusionrag r = 0.15 can prefill by FLOPs: for MuSiQue questions with 10
passages each, the positions of the tokens each sorted (sparse) pass computes, and the FLOPs of the
linear layers and of attention (a query at position p reads p + 1 keys) against Full Attention's.

    python flop_bound.py [DATASET (default ../shared/data/musique_dev.json)] [STORE (default :memory:)]
                         [QUESTIONS (default 1)] [SKIP (default 30: the held-out questions)]
"""

import statistics
import sys

import torch

import fusionrag_llm.models.attention_backend as backend
from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.eval.bench_quality import chunk_texts
from fusionrag_llm.eval.datasets import load_musique

torch.set_num_threads(2)
dataset = sys.argv[1] if len(sys.argv) > 1 else "../shared/data/musique_dev.json"
store = sys.argv[2] if len(sys.argv) > 2 else ":memory:"
count, skip = (int(sys.argv[3]) if len(sys.argv) > 3 else 1), (int(sys.argv[4]) if len(sys.argv) > 4 else 30)
rag = FusionRAG.from_pretrained("smollm2-135m", store=store)
cfg = rag.engine.model.cfg
params = sum(p.numel() for n, p in rag.engine.model.named_parameters() if "layers" in n and p.dim() == 2)
per_key = cfg.num_heads * cfg.head_dim * 4 * cfg.num_layers  # q.k and p.v, multiply-add, every layer

passes = []  # one positions tensor per sorted forward (every layer of a forward shares it)
attend = backend.attend


def recording(q, keys, values, mask, tail, sorted_positions=None):
    if sorted_positions is not None and (not passes or sorted_positions is not passes[-1]):
        passes.append(sorted_positions)
    return attend(q, keys, values, mask, tail, sorted_positions)


backend.attend = recording
ratios = []
print("| question | prompt tokens | tokens per pass | mean position / prompt (largest pass) | FLOP ratio FA / fusionrag |")
print("| --- | --- | --- | --- | --- |")
for example in load_musique(dataset, skip=skip, limit=count, passages=10):
    passes.clear()
    out = rag.generate(RAGRequest(chunks=chunk_texts(example), question=example.question), method="fusionrag",
                       recompute_ratio=0.15, max_new_tokens=1)  # fmt: skip
    length = out.stats.prompt_tokens
    sparse = sum(int((p + 1).sum()) * per_key + 2 * params * len(p) for p in passes)
    full = length * (length + 1) // 2 * per_key + 2 * params * length
    largest = max(passes, key=len)
    ratios.append(full / sparse)
    print(f"| {example.id} | {length} | {', '.join(str(len(p)) for p in passes)} | "
          f"{float(largest.float().mean()) / length:.2f} | {full / sparse:.2f}x |")  # fmt: skip
print(f"\nFLOP ratio over {len(ratios)} questions: median {statistics.median(ratios):.2f}x, "
      f"min {min(ratios):.2f}x, max {max(ratios):.2f}x")  # fmt: skip
