"""Options shared by several commands: one definition each, so a setting has one name and one meaning."""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass

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
         "(default: $FUSIONRAG_REMOTE; unreachable: logged, local tiers only). Its values are authenticated "
         "with $FUSIONRAG_REMOTE_SECRET; $FUSIONRAG_REMOTE_TRUSTED=1 opens it without one (docs/SECURITY.md).",
)  # fmt: skip
device_option = click.option("--device", default=None, help="'cpu' or 'cuda' (default: cuda when available).")
dtype_option = click.option("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on CPU, bfloat16 on a GPU that has it, else float16).")
workers_option = click.option(
    "--workers", default=None, type=click.IntRange(1, 1024),
    help="Compute the entries in N Ray worker processes writing into the store folder (needs the "
         "'distributed' extra; uses the running Ray cluster, else starts a local one). Default: this process.",
)  # fmt: skip


def _tenant(ctx, param, value):
    from fusionrag_llm import FusionRAGError, check_tenant

    try:
        return check_tenant(value) or None
    except FusionRAGError as exc:
        raise click.BadParameter(str(exc)) from None


tenant_option = click.option(
    "--tenant", default=None, metavar="NAME", callback=_tenant,
    help="Whose chunks and retrieval index: each tenant ingests and retrieves only its own, and its KV "
         "is never reused for another (docs/SECURITY.md). Default: the default tenant.",
)  # fmt: skip

ENGINE_OPTION_HELP = (
    "A field of EngineOptions (docs/api.md), e.g. kv_codec=int8 (how the store keeps chunk KV: "
    f"{', '.join(KV_CODECS)}; default: the store's recorded codec, {DEFAULT_KV_CODEC} for a new store), "
    "craft_variants=4 or layerwise_load=false; repeat for several."
)


def engine_option(keys: tuple[str, ...] = (), defaults: dict | None = None, help: str = ENGINE_OPTION_HELP):
    """``--engine-option KEY=VALUE``, repeatable, as a dict of EngineOptions fields over ``defaults`` (the
    command's own values). A value is read as JSON (numbers, true/false, null), else kept as text.
    ``keys``: the only fields the command honours; without them every field, checked when the engine loads."""

    def parse(ctx, param, values) -> dict:
        options = dict(defaults or {})
        for item in values:
            key, sep, text = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise click.BadParameter(f"{item!r} is not KEY=VALUE (e.g. {(keys or ('craft_variants',))[0]}=...)")
            if keys and key not in keys:
                raise click.BadParameter(f"{key!r}: this command takes {', '.join(keys)}")
            try:
                options[key] = json.loads(text)
            except json.JSONDecodeError:
                options[key] = text
        if options.get("kv_codec") not in (None, *KV_CODECS):  # before a run records it
            raise click.BadParameter(f"kv_codec {options['kv_codec']!r} is not one of {', '.join(KV_CODECS)}")
        return options

    return click.option("--engine-option", "engine_options", multiple=True, metavar="KEY=VALUE", callback=parse,
                        help=help)  # fmt: skip


def method_options(command):
    command = click.option("--ratio", default=None, type=click.FloatRange(0, 1),
                           help="Share of reused context tokens to recompute. Default: the method's own.")(command)  # fmt: skip
    return click.option("--method", default="fusionrag", show_default=True, type=click.Choice(list(method_names())),
                        help="How chunk KV is reused and which tokens are recomputed (see the README's table).")(command)  # fmt: skip


def neighbors_option(default: int, most: int | None = None, help: str = "Fusion neighbours per chunk."):
    return click.option("--neighbors", default=default, show_default=True, type=click.IntRange(0, most), help=help)


def max_new_tokens_option(default: int, most: int | None = 512, help: str = "Most tokens to generate per answer."):
    return click.option("--max-new-tokens", default=default, show_default=True, type=click.IntRange(1, most), help=help)


def baselines_option(default: str, allowed: tuple[str, ...], help: str):
    """``--baselines``: other engines timed on the same prompt ids, a comma list of ``allowed`` or none."""

    def parse(ctx, param, value) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip() not in ("", "none")))
        if any(name not in allowed for name in names):
            raise click.BadParameter(f"takes some of {', '.join(allowed)} (or none), got {value!r}")
        return names

    return click.option("--baselines", default=default, show_default=True, callback=parse, help=help)


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


@dataclass(frozen=True)
class EngineChoice:
    """The engine a command loads, as its --model, --store, --remote, --device and --dtype name it."""

    model: str
    store: str | None
    remote: str | None
    device: str | None
    dtype: str | None

    def load(self, engine_options: dict):
        """The engine, with the command's ``--engine-option`` fields (``--remote`` over their remote)."""
        return load_rag(self.model, self.device, self.dtype, self.store, **with_flags(engine_options, remote=self.remote))


def engine_choice_options(command):
    """--model, --store, --remote, --device and --dtype, handed to ``command`` as one ``engine`` (an ``EngineChoice``)."""

    @functools.wraps(command)
    def gathered(**params):
        names = ("model", "store", "remote", "device", "dtype")
        return command(engine=EngineChoice(*(params.pop(name) for name in names)), **params)

    for option in (dtype_option, device_option, remote_option, store_option, model_option):  # the last shows first
        gathered = option(gathered)
    return gathered


def progress_on() -> bool:
    """Progress bars on stderr when it is a terminal (not in logs, pipes or tests)."""
    return sys.stderr.isatty()


def repeats_option(default: int):
    return click.option("--repeats", default=default, show_default=True, type=click.IntRange(1),
                        help="Timed runs after one warm-up (median).")  # fmt: skip
