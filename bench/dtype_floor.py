"""How often Full Attention in another dtype gives float32 Full Attention's greedy answer.

    python bench/dtype_floor.py [--model smollm2-135m] [--dataset FILE] [--limit 100] [--passages 5]
                                [--max-new-tokens 16] [--dtype bfloat16] [--out DIR]

The quality benchmark's greedy EM compares a method's answer with float32 Full Attention's. This
runs Full Attention itself in ``--dtype`` over the same prompts and counts the answers that begin
with the float32 answer's first k tokens, and that equal it whole: what rounding alone does to the
metric, the floor under which no method's difference means anything. Writes floor.json (every
question's two answers) and floor.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.eval.bench_data import chunk_texts, dataset_label, load_examples
from fusionrag_llm.eval.metrics import parting_position
from fusionrag_llm.eval.results import markdown_table

TINY_ARGS = ["--model", "tiny", "--dataset", "synthetic", "--limit", "1", "--passages", "2", "--max-new-tokens", "4"]
PREFIXES = (1, 2, 4, 8)


def answers(model: str, dtype: str, examples, max_new_tokens: int) -> dict[str, list[int]]:
    rag = FusionRAG.from_pretrained(model, dtype=dtype, store=":memory:", options={"prefix_cache": False})
    found = {}
    for ex in examples:
        request = RAGRequest(chunks=chunk_texts(ex), question=ex.question)
        out = rag.generate(request, method="full_attention", recompute_ratio=1.0, max_new_tokens=max_new_tokens)
        found[ex.id] = list(out.token_ids)
    return found


def floor_table(rows: list[dict], dtype: str) -> str:
    parts = [parting_position(r["float32"], r[dtype]) for r in rows]
    shares = [sum(p is None or p >= k for p in parts) / len(rows) for k in PREFIXES]
    whole = sum(p is None for p in parts) / len(rows)
    return markdown_table(["questions", *(f"first {k}" for k in PREFIXES), "whole (greedy EM)"],
                          [[len(rows), *(f"{s:.2f}" for s in shares), f"{whole:.2f}"]])  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dataset", default=None, help="'synthetic' or a MuSiQue-format file (default: the shared one)")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--skip", type=int, default=0, help="questions dropped before the first of --limit")
    p.add_argument("--passages", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--out", default="bench_results")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    examples = load_examples(dataset_label(args.dataset), args.limit, args.passages, seed=0, skip=args.skip)
    reference = answers(args.model, "float32", examples, args.max_new_tokens)
    other = answers(args.model, args.dtype, examples, args.max_new_tokens)
    rows = [{"qid": ex.id, "float32": reference[ex.id], args.dtype: other[ex.id]} for ex in examples]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "floor.json").write_text(json.dumps({"config": vars(args), "rows": rows}, indent=1) + "\n")
    table = (f"# Full Attention in {args.dtype} against float32: {args.model}, {args.passages} passages, "
             f"{args.max_new_tokens} new tokens\n\nShare of questions whose {args.dtype} answer begins with the "
             f"float32 answer's first k tokens.\n\n{floor_table(rows, args.dtype)}\n")  # fmt: skip
    (out / "floor.md").write_text(table)
    print(table + f"wrote {out / 'floor.json'}, {out / 'floor.md'}")


if __name__ == "__main__":
    main()
