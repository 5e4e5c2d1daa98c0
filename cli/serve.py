"""``fusionrag serve``: an OpenAI-compatible HTTP server over the engine and its KV store."""

from __future__ import annotations

import os

import click

from fusionrag_llm.cli.options import ENGINE_OPTION_HELP, engine_choice_options, engine_option

LIMITS = {  # --limit NAME: (what it bounds, parse, smallest, largest, default)
    "waiting": ("requests waiting for admission; more are refused with HTTP 429", int, 1, 100_000, 256),
    "timeout": ("seconds a request may take before it is aborted (HTTP 408)", float, 0.1, 86_400.0, 600.0),
    "body_mib": ("MiB a request body may hold (HTTP 413)", float, 0.001, 1024.0, 16.0),
}


def _limits(ctx, param, values) -> dict:
    limits = {name: spec[4] for name, spec in LIMITS.items()}
    for item in values:
        name, sep, text = (part.strip() for part in item.partition("="))
        if not sep or name not in LIMITS:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE with NAME one of {', '.join(LIMITS)}")
        _, parse, low, high, _ = LIMITS[name]
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise click.BadParameter(f"{name} must be a{'n integer' if parse is int else ' number'} in [{low}, {high}], "
                                     f"got {text!r}")  # fmt: skip
        limits[name] = value
    return limits


def _keys(ctx, param, values) -> tuple[dict[str, str | None], bool | str]:
    """(API keys, each with the tenant it is bound to or None; chunk writes) from --api-key, else
    $FUSIONRAG_API_KEY (comma-separated); ``tenant:NAME=KEY`` binds KEY to tenant NAME; the chunk writes
    from a ``chunks=KEY|off`` entry, else $FUSIONRAG_CHUNKS_KEY (a key or ``off``), else open."""
    from fusionrag_llm import FusionRAGError
    from fusionrag_llm.server.access import Access

    given = list(values) or [key.strip() for key in os.environ.get("FUSIONRAG_API_KEY", "").split(",") if key.strip()]
    keys = {}  # key -> the tenant it is bound to (tenant:NAME=KEY), or None
    for value in given:
        if value.startswith("chunks="):
            continue
        name, sep, key = value.removeprefix("tenant:").partition("=") if value.startswith("tenant:") else ("", "", value)
        if value.startswith("tenant:") and not (sep and name and key):
            raise click.BadParameter(f"{value.split('=')[0]!r}: a key bound to a tenant is given as tenant:NAME=KEY")
        keys[key] = name or None
    scoped = [value.removeprefix("chunks=") for value in given if value.startswith("chunks=")]
    if len(scoped) > 1:
        raise click.BadParameter("give at most one chunks=KEY (or chunks=off)")
    writes = scoped[0] if scoped else os.environ.get("FUSIONRAG_CHUNKS_KEY", "").strip() or True
    writes = False if writes == "off" else writes
    try:
        access = Access.of(keys, writes)
    except FusionRAGError as exc:
        raise click.BadParameter(str(exc)) from None
    return {key: access.tenants.get(key) for key in access.api_keys}, access.chunk_writes


@click.command()
@engine_choice_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; 0.0.0.0 exposes the server to the network.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option("--served-model-name", default=None, help="The model id clients send (default: the --model value).")
@click.option("--max-num-seqs", default=None, type=click.IntRange(1, 1024),
              help="Answers decoding together in one batch (default: 16 on a CPU, 256 on a GPU).")
@click.option("--api-key", "access", multiple=True, metavar="KEY", callback=_keys,
              help="A key clients must send (Authorization: Bearer KEY, the OpenAI client's api_key) on every route "
                   "but /health; repeat for several (default: $FUSIONRAG_API_KEY, comma-separated; none: no key "
                   "asked). tenant:NAME=KEY: KEY serves tenant NAME only. chunks=KEY: only KEY may register "
                   "chunks (POST /v1/chunks; default: $FUSIONRAG_CHUNKS_KEY); chunks=off: nobody may.")  # fmt: skip
@click.option("--limit", "limits", multiple=True, metavar="NAME=VALUE", callback=_limits,
              help="A limit on requests, repeatable: waiting=256 (requests queued for admission; more: HTTP 429), "
                   "timeout=600 (seconds a request may take: HTTP 408), body_mib=16 (request body size: HTTP 413).")  # fmt: skip
@engine_option(defaults={"turn_cache_gib": 2.0},
               help=ENGINE_OPTION_HELP + " Here turn_cache_gib (memory on the model's device for multi-turn reuse: a chat's next turn "
                    "reads the last turn's KV) is 2 unless given (0: off).")  # fmt: skip
def serve(engine, host, port, served_model_name, max_num_seqs, access, limits, engine_options) -> None:
    """Serve /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models and /v1/chunks (OpenAI-compatible).

    Extra body fields choose the reuse method per request: method, recompute_ratio, method_options.
    Register chunks with POST /v1/chunks {"texts": [...]} or with `fusionrag ingest --store` on the
    same store before starting. Exposed beyond this machine (--host 0.0.0.0), set --api-key.
    """
    from fusionrag_llm.server import serve as run_server

    api_keys, chunk_writes = access
    rag = engine.load(engine_options)
    click.echo(f"serving {served_model_name or rag.model_name!r} on http://{host}:{port}/v1", err=True)
    _log_requests()
    run_server(rag, host=host, port=port, served_model_name=served_model_name, max_waiting=limits["waiting"],
               request_timeout=limits["timeout"], max_num_seqs=max_num_seqs,
               max_body_bytes=int(limits["body_mib"] * 2**20), api_keys=api_keys, chunk_writes=chunk_writes)  # fmt: skip


def _log_requests() -> None:
    """One line per finished request on stderr (``server/metrics.py``), unless logging says otherwise."""
    import logging

    requests = logging.getLogger("fusionrag_llm.server.requests")
    if not requests.handlers and requests.level == logging.NOTSET:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        requests.addHandler(handler)
        requests.setLevel(logging.INFO)
        requests.propagate = False
