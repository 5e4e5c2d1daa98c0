"""``fusionrag serve``: an OpenAI-compatible HTTP server over the engine and its KV store."""

from __future__ import annotations

import click

from fusionrag_llm.cli.options import (
    ENGINE_OPTION_HELP, device_option, dtype_option, engine_option, load_rag, model_option, remote_option, store_option,
    with_flags,
)


@click.command()
@model_option
@store_option
@remote_option
@device_option
@dtype_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; 0.0.0.0 exposes the server to the network.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option("--served-model-name", default=None, help="The model id clients send (default: the --model value).")
@click.option("--max-num-seqs", default=16, show_default=True, type=click.IntRange(1, 1024), help="Answers decoding together in one batch.")
@click.option("--max-waiting", default=256, show_default=True, type=click.IntRange(1, 100000),
              help="Requests that may wait for admission; more are refused with HTTP 429.")
@click.option("--request-timeout", default=600.0, show_default=True, type=click.FloatRange(0.1),
              help="Seconds a request may take before it is aborted (HTTP 408).")
@engine_option(defaults={"turn_cache_gib": 2.0},
               help=ENGINE_OPTION_HELP + " Here turn_cache_gib (host memory for multi-turn reuse: a chat's next turn "
                    "reads the last turn's KV) is 2 unless given (0: off).")  # fmt: skip
def serve(model, store, remote, device, dtype, host, port, served_model_name, max_num_seqs, max_waiting, request_timeout,
          engine_options) -> None:  # fmt: skip
    """Serve /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models and /v1/chunks (OpenAI-compatible).

    Extra body fields choose the reuse method per request: method, recompute_ratio, method_options.
    Register chunks with POST /v1/chunks {"texts": [...]} or with `fusionrag ingest --store` on the
    same store before starting.
    """
    from fusionrag_llm.server import serve as run_server

    rag = load_rag(model, device, dtype, store, **with_flags(engine_options, remote=remote))
    click.echo(f"serving {served_model_name or rag.model_name!r} on http://{host}:{port}/v1", err=True)
    run_server(rag, host=host, port=port, served_model_name=served_model_name, max_waiting=max_waiting,
               request_timeout=request_timeout, max_num_seqs=max_num_seqs)
