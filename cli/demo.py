"""``fusionrag demo``: answer a few questions over the bundled corpus and show the time to first token."""

from __future__ import annotations

import json
from importlib import resources

import click

from fusionrag_llm.cli.options import device_option, dtype_option, load_rag, model_option


def demo_corpus() -> dict:
    return json.loads(resources.files("fusionrag_llm.data").joinpath("demo_corpus.json").read_text())


@click.command()
@model_option
@device_option
@dtype_option
@click.option("--max-new-tokens", default=24, show_default=True, type=click.IntRange(1, 512))
def demo(model: str, device: str | None, dtype: str | None, max_new_tokens: int) -> None:
    """Answer the bundled questions with full attention and print answers and TTFT."""
    from fusionrag_llm import RAGRequest

    corpus = demo_corpus()
    rag = load_rag(model, device, dtype)
    click.echo(f"model: {rag.loaded.name} ({rag.loaded.model.device}, {rag.loaded.model.dtype})")
    for item in corpus["questions"]:
        chunks = [corpus["passages"][i] for i in item["passages"]]
        out = rag.generate(RAGRequest(chunks=chunks, question=item["question"]),
                           method="full_attention", max_new_tokens=max_new_tokens)  # fmt: skip
        click.echo(f"\nQ: {item['question']}  (expected: {item['answer']})")
        click.echo(f"A: {out.text.strip()}")
        click.echo(f"   full_attention: {out.stats.prompt_tokens} prompt tokens, TTFT {out.stats.ttft_s * 1000:.0f} ms")
