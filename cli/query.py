"""``fusionrag query "question"``: retrieve from the ingested index and answer, with a stats table."""

from __future__ import annotations

import click

from fusionrag_llm.cli.options import (
    engine_choice_options, engine_option, max_new_tokens_option, method_options, tenant_option, user_errors,
)


@click.command()
@click.argument("question")
@engine_choice_options
@method_options
@click.option("--top-k", default=5, show_default=True, type=click.IntRange(1, 64), help="Chunks to retrieve.")
@max_new_tokens_option(64, 2048)
@click.option("--show-chunks", is_flag=True, help="Print the retrieved chunks.")
@tenant_option
@engine_option()
def query(question, engine, method, ratio, top_k, max_new_tokens, show_chunks, tenant, engine_options) -> None:
    """Answer QUESTION over the chunks ingested into the store."""
    from fusionrag_llm.ingest.pipeline import answer

    _require_store(engine.store, tenant)
    rag = engine.load(engine_options)
    try:
        # Full Attention, the yardstick, is timed computing every token, never served exact KV left by
        # earlier queries (any method: --engine-option reproducible=true)
        out, hits = answer(rag, question, top_k=top_k, tenant=tenant, method=method, recompute_ratio=ratio, max_new_tokens=max_new_tokens,
                           reproducible=True if method == "full_attention" else None)  # fmt: skip
    except user_errors() as exc:
        raise click.ClickException(str(exc)) from None
    if show_chunks:
        for rank, hit in enumerate(hits, 1):
            text = hit.text
            click.echo(f"[{rank}] {hit.score:.3f} {hit.source}: {text[:160]}{'...' if len(text) > 160 else ''}")
    click.echo(out.text.strip())
    s = out.stats
    rows = [
        ("method", f"{s.method} (r={s.recompute_ratio})"),
        ("TTFT", f"{s.ttft_s * 1000:.0f} ms (load {s.load_s * 1000:.0f}, select {s.select_s * 1000:.0f}, prefill {s.prefill_s * 1000:.0f})"),
        ("prompt tokens", f"{s.prompt_tokens} = {s.exact_tokens} exact + {s.reused_tokens} reused + "
                          f"{s.recomputed_tokens} recomputed + {s.missed_tokens + s.fresh_tokens} computed "
                          f"({s.missed_tokens} of chunks not stored yet, {s.fresh_tokens} of other text)"),
        ("chunks", ", ".join(f"{k} {v}" for k, v in s.path_hits.items())),
        ("variants", ", ".join(f"{k} {v}" for k, v in s.variant_hits.items())),
        ("decode", f"{s.generated_tokens} tokens in {s.decode_s:.2f} s"),
    ]
    if s.method_stats:
        rows.append((s.method, ", ".join(f"{k} {v}" for k, v in s.method_stats.items())))
    click.echo("")
    for name, value in rows:
        click.echo(f"{name:>14}  {value}")


def _require_store(store: str | None, tenant: str | None) -> None:
    """A query reads an ingested store: a missing folder is an error, never created as a side effect,
    and a store without a document index is one too, found before the model loads."""
    import os
    import stat
    from pathlib import Path

    from fusionrag_llm.ingest.doc_index import LEGACY_FOLDER, documents_file
    from fusionrag_llm.paths import store_dir

    folder = Path(store).expanduser() if store else store_dir()
    if not folder.is_dir():
        raise click.ClickException(f"no KV store at {str(folder)!r}: run `fusionrag ingest` first, or pass --store")

    def present(name: str, kind) -> bool:  # looked at, never followed: the store reads it without links
        try:
            info = os.lstat(folder / name)
        except OSError:
            return False
        return kind(info.st_mode) and (kind is stat.S_ISDIR or info.st_size > 0)

    if not present(documents_file(tenant or ""), stat.S_ISREG) and (tenant or not present(LEGACY_FOLDER, stat.S_ISDIR)):
        whose = f"tenant {tenant!r}'s document index" if tenant else "the document index"
        again = f"'fusionrag ingest PATH --tenant {tenant}'" if tenant else "'fusionrag ingest PATH'"
        raise click.ClickException(f"{whose} of the store {str(folder)!r} is empty; run {again} first")
