"""``fusionrag ingest PATH...``: files and folders -> chunks -> FAISS index -> plain and fused KV entries."""

from __future__ import annotations

import click

from fusionrag_llm.cli.options import (engine_choice_options, engine_option, neighbors_option, tenant_option, user_errors,
                                       workers_option)  # fmt: skip


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@engine_choice_options
@neighbors_option(10, 64, "Neighbours each chunk is fused with.")
@click.option("--max-words", default=200, show_default=True, type=click.IntRange(8, 4000), help="Words per chunk at most.")
@click.option("--no-fuse", is_flag=True, help="Store plain entries only.")
@click.option("--variant-notes", is_flag=True,
              help="Fused entries also keep the notes the cache_craft method reads (about 70% more time per fused entry).")
@workers_option
@tenant_option
@engine_option()
def ingest(paths, engine, neighbors, max_words, no_fuse, variant_notes, workers, tenant, engine_options) -> None:
    """Ingest text and markdown files (folders are searched for *.txt, *.md, *.rst). Resumable."""
    from fusionrag_llm.ingest.documents import load_chunks
    from fusionrag_llm.ingest.pipeline import ingest_paths

    try:  # every file is read and checked before the model loads
        load_chunks(paths, max_words)
    except user_errors() as exc:
        raise click.ClickException(str(exc)) from None
    rag = engine.load(engine_options)
    try:
        summary = ingest_paths(rag, paths, max_words=max_words, neighbors=neighbors, fuse=not no_fuse,
                               variant_notes=variant_notes, workers=workers, tenant=tenant)  # fmt: skip
    except user_errors() as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{summary.files} files, {summary.chunks} chunks ({summary.new_chunks} new): "
               f"{summary.plain_computed} plain and {summary.fused_computed} fused entries computed "
               f"into {rag.store.directory}")  # fmt: skip
