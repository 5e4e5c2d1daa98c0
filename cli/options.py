"""Options shared by several commands."""

from __future__ import annotations

import json

import click

from fusionrag_llm import DEFAULT_KV_CODEC, DEFAULT_MODEL, KV_CODECS, method_names

model_option = click.option(
    "--model", default=DEFAULT_MODEL, show_default=True,
    help="Model name ('smollm2-135m', 'tiny'), a model folder, a .gguf file or a hub id.",
)  # fmt: skip
store_option = click.option("--store", default=None, help="KV store folder (default: $FUSIONRAG_STORE or the user cache).")
remote_option = click.option(
    "--remote", default=None, metavar="URL",
    help="Redis/Valkey server of a KV tier shared by several engines, e.g. redis://127.0.0.1:6379/0 "
         "(default: $FUSIONRAG_REMOTE; unreachable: logged, local tiers only).",
)  # fmt: skip
device_option = click.option("--device", default=None, help="'cpu' or 'cuda' (default: cuda when available).")


def _engine_options(ctx, param, values) -> dict:
    """``KEY=VALUE`` pairs as EngineOptions fields; a value is read as JSON (numbers, true/false, null),
    else kept as text. The fields are checked when the engine loads."""
    options = {}
    for item in values:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE (e.g. craft_variants=4)")
        try:
            options[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            options[key.strip()] = text
    return options


engine_option = click.option(
    "--engine-option", "engine_options", multiple=True, metavar="KEY=VALUE", callback=_engine_options,
    help="A field of EngineOptions (docs/api.md), e.g. craft_variants=4 (Cache-Craft's request-made variants) or "
         "layerwise_load=false; repeat for several.",
)  # fmt: skip
workers_option = click.option(
    "--workers", default=None, type=click.IntRange(1, 1024),
    help="Compute the entries in N Ray worker processes writing into the store folder (needs the "
         "'distributed' extra; uses the running Ray cluster, else starts a local one). Default: this process.",
)  # fmt: skip
dtype_option = click.option("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on CPU).")


def kv_codec_option(default: str | None = None, why: str = ""):
    """``--kv-codec``: how the store keeps chunk KV. Without a default, the codec the store folder
    records (``storage/store_codec.py``), else ``DEFAULT_KV_CODEC`` for a new store, as in the Python API."""
    shown = default or f"the store's recorded codec; a new store: {DEFAULT_KV_CODEC}"
    return click.option(
        "--kv-codec", default=default, type=click.Choice(list(KV_CODECS)),
        help="How the store keeps chunk KV: 'model' (the compute dtype, exact), float32, bf16, fp16, or quantized "
             f"int8, fp8, int4 (smaller, approximate; part of the entry keys). Default: {shown}{why}.",
    )  # fmt: skip


def method_options(command):
    command = click.option("--ratio", default=None, type=click.FloatRange(0, 1),
                           help="Share of reused context tokens to recompute. Default: the method's own.")(command)  # fmt: skip
    return click.option("--method", default="fusionrag", show_default=True, type=click.Choice(list(method_names())),
                        help="How chunk KV is reused and which tokens are recomputed (see the README's table).")(command)  # fmt: skip


def user_errors() -> tuple[type[Exception], ...]:
    """Errors that are the user's input or store, shown as a message rather than a traceback."""
    from fusionrag_llm import FusionRAGError
    from fusionrag_llm.storage import StoreDamagedError

    return FusionRAGError, StoreDamagedError


def with_flags(engine_options: dict, **flags) -> dict:
    """``--engine-option`` fields updated by the command's own flags that were given (not None)."""
    return {**engine_options, **{name: value for name, value in flags.items() if value is not None}}


def load_rag(model: str, device: str | None, dtype: str | None, store=None, **options):
    """Load the engine, turning the library's input errors into clean CLI errors."""
    from fusionrag_llm import FusionRAG

    options = {k: v for k, v in options.items() if k != "remote" or v is not None}
    try:
        return FusionRAG.from_pretrained(model, device=device, dtype=dtype, store=store, options=options)
    except user_errors() as exc:
        raise click.ClickException(str(exc)) from None
