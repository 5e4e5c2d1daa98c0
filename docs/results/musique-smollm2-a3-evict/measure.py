"""A3 with and without decode KV eviction against Full Attention on a few MuSiQue questions.

Per question: Full Attention's greedy answer (16 tokens) is the reference; each configuration is
teacher forced on it (mean KL(FA || config) over the rows predicting its tokens, and the share of
those rows whose argmax is the reference token) and answers greedily once (exact match with the
reference answer, and the decode KV its stats report). Only plain entries are stored (A3 reads no
fused ones). Usage (from the repository root):

    python docs/results/musique-smollm2-a3-evict/measure.py ../shared/data/musique_dev.json 3 3 128
"""

import json
import sys
from pathlib import Path

import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.eval.bench_data import load_examples, passage_pool
from fusionrag_llm.eval.metrics import mean_kl


def main(dataset: str, limit: int, passages: int, budgets: list[int]) -> None:
    examples = load_examples(dataset, limit=limit, passages=passages, seed=0)
    rag = FusionRAG.from_pretrained("smollm2-135m", store=":memory:", prefix_cache=False)  # no exact KV left behind
    pool = passage_pool(examples)
    rag.add_chunks(pool, fuse=False, embeddings=torch.eye(len(pool)))
    configs = [("a3", None)] + [(f"a3@{b}", b) for b in budgets]
    records = []
    for ex in examples:
        request = RAGRequest(chunks=[p.text for p in ex.passages], question=ex.question)
        fa = rag.generate(request, method="full_attention", max_new_tokens=16)
        ref = list(fa.token_ids)
        rows = max(len(ref), 1)
        fa_logits = rag.logits(request, ref, method="full_attention")[:rows]
        for label, budget in configs:
            knobs = dict(method="a3", recompute_ratio=0.15, decode_kv_budget=budget)
            logits = rag.logits(request, ref, **knobs)[:rows]
            out = rag.generate(request, max_new_tokens=16, **knobs)
            agree = float((logits.argmax(-1)[: len(ref)] == torch.tensor(ref)).float().mean()) if ref else 1.0
            records.append({"qid": ex.id, "config": label, "prompt_tokens": out.stats.prompt_tokens,
                            "decode_kv_tokens": out.stats.decode_kv_tokens or out.stats.prompt_tokens,
                            "kl": mean_kl(fa_logits, logits), "token_agreement": agree,
                            "greedy_em": float(out.token_ids == ref)})
            print(json.dumps(records[-1]), flush=True)
    Path(__file__).with_name("records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    print(table(records, [label for label, _ in configs]))


def table(records: list[dict], labels: list[str]) -> str:
    lines = ["| config | n | prompt tokens | decode KV kept per head | KL(FA‖config) | token agreement | greedy EM |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for label in labels:
        rows = [r for r in records if r["config"] == label]
        mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
        lines.append(f"| {label} | {len(rows)} | {mean('prompt_tokens'):.0f} | {mean('decode_kv_tokens'):.0f} | "
                     f"{mean('kl'):.4f} | {mean('token_agreement'):.3f} | {mean('greedy_em'):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [int(b) for b in sys.argv[4].split(",")])
