"""Options shared by several commands."""

from __future__ import annotations

import click

from fusionrag_llm import DEFAULT_KV_CODEC, DEFAULT_MODEL, FUSED_ORDERS, KV_CODECS, METHODS

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
fused_order_option = click.option(
    "--fused-order", default=None, type=click.Choice(list(FUSED_ORDERS)),
    help="Layout of the fused entries to read, as ingested with `fusionrag ingest --fused-order` (default: the one "
         "layout the store's catalog records, else the default).",
)  # fmt: skip
craft_variants_option = click.option(
    "--craft-variants", default=0, show_default=True, type=click.IntRange(0), metavar="M",
    help="Cache-Craft's request-made variants: cache_craft requests store a chunk's KV after new prefixes and "
         "read them later, about M per chunk kept (0: off).",
)  # fmt: skip
layerwise_load_option = click.option(
    "--layerwise-load/--no-layerwise-load", default=None,
    help="Cache-Craft's layer-wise loading: stored KV reaches the request layer by layer while the prefill runs "
         "(default: on for a CUDA model, off on the CPU).",
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
    command = click.option("--ratio", default=0.15, show_default=True, type=click.FloatRange(0, 1),
                           help="Share of reused context tokens to recompute.")(command)  # fmt: skip
    return click.option("--method", default="fusionrag", show_default=True, type=click.Choice(list(METHODS)),
                        help="How chunk KV is reused and which tokens are recomputed (see the README's table).")(command)  # fmt: skip


def user_errors() -> tuple[type[Exception], ...]:
    """Errors that are the user's input or store, shown as a message rather than a traceback."""
    from fusionrag_llm import FusionRAGError
    from fusionrag_llm.storage import StoreDamagedError

    return FusionRAGError, StoreDamagedError


def load_rag(model: str, device: str | None, dtype: str | None, store=None, **options):
    """Load the engine, turning the library's input errors into clean CLI errors."""
    from fusionrag_llm import FusionRAG

    options = {k: v for k, v in options.items() if k != "remote" or v is not None}
    try:
        return FusionRAG.from_pretrained(model, device=device, dtype=dtype, store=store, **options)
    except user_errors() as exc:
        raise click.ClickException(str(exc)) from None
