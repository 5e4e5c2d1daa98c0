"""Cache-Craft with and without request-made variants (``craft_variants``) on repeated MuSiQue prompts.

The paper's setting is chunks that come back in later requests. Per question (its passages as the
chunks), four requests in a row: the dataset's passage order (a1), the same again (a2), a shuffled
order (a3), that again (a4). ``cache_craft`` at r = 0.15 answers each on two engines over one store
(ingested once: plain and fused entries with notes): ``off`` (no request-made variants; a1 = a2 and
a3 = a4) and ``on`` (``craft_variants=5``: a1 and a3 store variants, a2 and a4 can read them, and a3
can read a1's where prefixes overlap). Each answer is greedy (16 tokens) and teacher forced on Full
Attention's greedy answer for the same order, from the same prefill (the bench's KL(FA || method)).
Usage (from the repository root; writes records.jsonl and prints the table):

    python docs/results/musique-smollm2-craft-variants/measure.py ../shared/data/musique_dev.json 60 15 5 STORE_DIR [MODEL]
"""

import json
import random
import sys
from pathlib import Path

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.eval.bench_data import load_examples, passage_pool
from fusionrag_llm.eval.metrics import greedy_exact_match, mean_kl

RATIO, NEW_TOKENS, NEIGHBOURS = 0.15, 16, 4


def answer(rag, request, ref=None):
    stream = rag.stream(request, "cache_craft", RATIO, NEW_TOKENS)
    for _ in stream:
        pass
    return stream, (stream.score(ref) if ref is not None else None)


def main(dataset: str, skip: int, limit: int, passages: int, store: str, model: str = "smollm2-135m") -> None:
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
            asks = [("off", off, order_name)] + [("on", on, f"{order_name}-{i}") for i in (1, 2)]
            for engine_name, rag, ask in asks:
                out, logits = answer(rag, request, ref)
                stats = out.stats
                records.append({"qid": ex.id, "engine": engine_name, "ask": ask, "kl": mean_kl(ref_logits, logits),
                                "greedy_em": greedy_exact_match(ref, out.token_ids), "ttft_s": stats.ttft_s,
                                "recomputed_tokens": stats.recomputed_tokens, "variants_made": stats.variants_made,
                                "request_hits": stats.variant_hits.get("request", 0), "chunks": len(chunks)})  # fmt: skip
                print(json.dumps(records[-1]), flush=True)
    Path(__file__).with_name("records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    print(table(records))


def table(records: list[dict]) -> str:
    lines = ["| engine | ask | n | mean KL | median | max | KL above off (same order) | greedy EM | chunks from request variants | variants made |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    off = {(r["qid"], r["ask"]): r["kl"] for r in records if r["engine"] == "off"}
    for engine, ask in dict.fromkeys((r["engine"], r["ask"]) for r in records):
        rows = [r for r in records if (r["engine"], r["ask"]) == (engine, ask)]
        kls = sorted(r["kl"] for r in rows)
        worse = sum(r["kl"] > off[(r["qid"], ask.split("-")[0])] + 1e-4 for r in rows) if engine == "on" else "-"
        mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
        lines.append(f"| {engine} | {ask} | {len(rows)} | {mean('kl'):.4f} | {kls[len(kls) // 2]:.4f} | {kls[-1]:.4f} | "
                     f"{worse} | {mean('greedy_em'):.2f} | {sum(r['request_hits'] for r in rows)} / "
                     f"{sum(r['chunks'] - 1 for r in rows)} | {sum(r['variants_made'] for r in rows)} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:7])
