"""Cache-Craft with and without request-made variants (``craft_variants``) on repeated MuSiQue prompts.

The paper's setting is chunks that come back in later requests. Per question (its passages as the
chunks) and per passage order (the dataset's, then a shuffled one), ``cache_craft`` answers on two
engines over one store (ingested once: plain and fused entries with notes, 4 neighbours):

* ``off`` (no request-made variants) at r = 0.15 and at r = 0;
* ``on`` (``craft_variants=5``): first at r = 0.15 (it stores the variants of chunks after new
  prefixes), then the same prompt again at r = 0 (reading them, recomputing nothing) and at r = 0.15.

The shuffled order comes after the dataset order, so its first ``on`` request can also read variants
whose prefix it shares. Each answer is greedy (16 tokens) and teacher forced on Full Attention's
greedy answer for the same order, from the same prefill (the bench's KL(FA || method)).
``POLICY`` (default ``cfo``, the paper's) is the ``on`` engine's ``variant_policy``; ``cfo_exact``
reads a request-made variant only after exactly its prefix. Usage (from the repository root; writes
records.jsonl, or records-POLICY.jsonl for another policy, and prints the table):

    python docs/results/musique-smollm2-craft-variants/measure.py ../shared/data/musique_dev.json 60 15 5 STORE_DIR [MODEL [POLICY]]
"""

import json
import random
import sys
from pathlib import Path

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.eval.bench_data import load_examples, passage_pool
from fusionrag_llm.eval.metrics import greedy_exact_match, mean_kl

RATIO, NEW_TOKENS, NEIGHBOURS = 0.15, 16, 4


def answer(rag, request, ratio, ref=None, policy="cfo"):
    stream = rag.stream(request, "cache_craft", ratio, NEW_TOKENS, variant_policy=policy)
    for _ in stream:
        pass
    return stream, (stream.score(ref) if ref is not None else None)


def main(dataset: str, skip: int, limit: int, passages: int, store: str, model: str = "smollm2-135m",
         policy: str = "cfo") -> None:  # fmt: skip
    examples = load_examples(dataset, limit=limit, passages=passages, seed=0, skip=skip)
    off = FusionRAG.from_pretrained(model, store=store, prefix_cache=False, kv_codec="model")
    off.ingest(passage_pool(examples), neighbors=NEIGHBOURS, variant_notes=True)
    on = FusionRAG.from_pretrained(model, store=store, prefix_cache=False, kv_codec="model", craft_variants=5)
    records = []
    for ex in examples:
        texts = [p.text for p in ex.passages]
        shuffled = random.Random(ex.id).sample(texts, len(texts))
        for order_name, chunks in (("dataset", texts), ("shuffled", shuffled)):
            request = RAGRequest(chunks=chunks, question=ex.question)
            fa = off.stream(request, "full_attention", 1.0, NEW_TOKENS)
            for _ in fa:
                pass
            ref = list(fa.token_ids)
            ref_logits = fa.score(ref)
            asks = [("off", off, "first", RATIO), ("off", off, "first", 0.0), ("on", on, "first", RATIO),
                    ("on", on, "again", 0.0), ("on", on, "again", RATIO)]  # fmt: skip
            for engine_name, rag, ask, ratio in asks:
                out, logits = answer(rag, request, ratio, ref, policy if engine_name == "on" else "cfo")
                stats = out.stats
                records.append({"qid": ex.id, "order": order_name, "engine": engine_name, "ask": ask, "ratio": ratio,
                                "kl": mean_kl(ref_logits, logits),
                                "greedy_em": greedy_exact_match(ref, out.token_ids), "ttft_s": stats.ttft_s,
                                "recomputed_tokens": stats.recomputed_tokens, "variants_made": stats.variants_made,
                                "request_hits": stats.variant_hits.get("request", 0), "chunks": len(chunks)})  # fmt: skip
                print(json.dumps(records[-1]), flush=True)
    Path(__file__).with_name("records.jsonl" if policy == "cfo" else f"records-{policy}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    print(table(records))


def table(records: list[dict]) -> str:
    lines = ["| order | engine | request | r | n | mean KL | median | max | further than off at r = 0.15 | greedy EM | "
             "recomputed tokens | chunks from request variants | variants made |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    base = {(r["qid"], r["order"]): r["kl"] for r in records if r["engine"] == "off" and r["ratio"] == RATIO}
    for group in dict.fromkeys((r["order"], r["engine"], r["ask"], r["ratio"]) for r in records):
        rows = [r for r in records if (r["order"], r["engine"], r["ask"], r["ratio"]) == group]
        kls = sorted(r["kl"] for r in rows)
        worse = sum(r["kl"] > base[(r["qid"], r["order"])] + 1e-4 for r in rows)
        mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
        lines.append(f"| {group[0]} | {group[1]} | {group[2]} | {group[3]:g} | {len(rows)} | {mean('kl'):.4f} | "
                     f"{kls[len(kls) // 2]:.4f} | {kls[-1]:.4f} | {worse} | {mean('greedy_em'):.2f} | "
                     f"{mean('recomputed_tokens'):.0f} | {sum(r['request_hits'] for r in rows)} / "
                     f"{sum(r['chunks'] - 1 for r in rows)} | {sum(r['variants_made'] for r in rows)} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:8])
