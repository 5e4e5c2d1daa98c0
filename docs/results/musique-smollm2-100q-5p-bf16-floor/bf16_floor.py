"""How often Full Attention in bfloat16 gives Full Attention's float32 greedy answer (analysis only).

The greedy-EM target compares a method's 16-token greedy answer with float32 Full Attention's. This
runs Full Attention itself in another dtype over the same prompts (the questions of a bench-quality
run, 5 passages each, 16 new tokens) and prints the share of answers that begin with the float32
answer's first k tokens and that equal it whole: what rounding alone does to the metric.

    python bf16_floor.py REFERENCE_quality.json DATASET.json LIMIT OUT.jsonl [dtype]
    python bf16_floor.py OUT.jsonl   # the table of an earlier run
"""
import json
import sys
from pathlib import Path


def table(path):
    rows = [json.loads(line) for line in open(path)]
    shares = {k: sum(r["token_ids"][:k] == r["ref"][:k] for r in rows) / len(rows) for k in (1, 2, 4, 8)}
    whole = sum(r["token_ids"] == r["ref"] for r in rows) / len(rows)
    print(f"n={len(rows)} " + " ".join(f"first {k}: {v:.2f}" for k, v in shares.items()) + f" whole: {whole:.2f}")


def run(reference, dataset, limit, out, dtype):
    from fusionrag_llm import FusionRAG, RAGRequest
    from fusionrag_llm.eval.bench_data import chunk_texts
    from fusionrag_llm.eval.datasets import load_musique

    records = json.load(open(reference))["records"]
    fa = {r["qid"]: r["token_ids"] for r in records if r["method"] == "full_attention"}
    done = {json.loads(line)["qid"] for line in open(out)} if Path(out).exists() else set()
    rag = FusionRAG.from_pretrained("smollm2-135m", dtype=dtype, store=":memory:", prefix_cache=False)
    with open(out, "a") as f:
        for ex in load_musique(dataset, limit=limit, passages=5):
            if ex.id in done:
                continue
            stream = rag.stream(RAGRequest(chunks=chunk_texts(ex), question=ex.question), "full_attention", 1.0, 16, seed=0)
            for _ in stream:
                pass
            f.write(json.dumps({"qid": ex.id, "token_ids": list(stream.token_ids), "ref": fa[ex.id]}) + "\n")
            f.flush()


if __name__ == "__main__":
    if len(sys.argv) > 2:
        run(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else "bfloat16")
    table(sys.argv[-1] if len(sys.argv) == 2 else sys.argv[4])
