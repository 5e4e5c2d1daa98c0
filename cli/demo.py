"""``fusionrag demo``: ingest the bundled corpus, then answer its questions with full attention and
with FusionRAG side by side (answers, time to first token, tokens reused and recomputed)."""

from __future__ import annotations

import click

from fusionrag_llm.data import demo_corpus
from fusionrag_llm.cli.options import device_option, dtype_option, load_rag, model_option


@click.command()
@model_option
@device_option
@dtype_option
@click.option("--ratio", default=0.15, show_default=True, type=click.FloatRange(0, 1), help="Recompute ratio of fusionrag.")
@click.option("--max-new-tokens", default=24, show_default=True, type=click.IntRange(1, 512), help="Most tokens to generate per answer.")
@click.option("--store", default=":memory:", show_default=True, help="KV store folder (the demo keeps it in memory).")
def demo(model: str, device: str | None, dtype: str | None, ratio: float, max_new_tokens: int, store: str) -> None:
    """Full attention vs FusionRAG on a small bundled corpus."""
    from fusionrag_llm import RAGRequest

    corpus = demo_corpus()
    rag = load_rag(model, device, dtype, store, prefix_cache=False)
    click.echo(f"model: {rag.model_name} ({rag.parts.loaded.model.device}, {rag.parts.loaded.model.dtype})")
    report = rag.ingest(corpus["passages"], neighbors=3, progress=True)
    click.echo(f"ingested {len(corpus['passages'])} passages: {report.plain_computed} plain and "
               f"{report.fused_computed} fused entries computed")  # fmt: skip
    for item in corpus["questions"]:
        request = RAGRequest(chunks=[corpus["passages"][i] for i in item["passages"]], question=item["question"])
        click.echo(f"\nQ: {item['question']}  (expected: {item['answer']})")
        for method in ("full_attention", "fusionrag"):
            out = rag.generate(request, method=method, recompute_ratio=ratio, max_new_tokens=max_new_tokens)
            s = out.stats
            click.echo(f"  {method:<15} TTFT {s.ttft_s * 1000:6.0f} ms  computed {s.computed_tokens:4d} / "
                       f"{s.prompt_tokens} tokens  reused {s.reused_tokens:4d}  A: {out.text.strip()}")  # fmt: skip
