"""The ``fusionrag`` command group; each command lives in its own module, imported when used."""

from __future__ import annotations

import importlib
import logging

import click

# command name -> "module:attribute"; modules are imported only when their command runs
COMMANDS = {
    "bench": "fusionrag_llm.cli.bench:bench",
    "cache": "fusionrag_llm.cli.cache:cache",
    "demo": "fusionrag_llm.cli.demo:demo",
    "ingest": "fusionrag_llm.cli.ingest:ingest",
    "models": "fusionrag_llm.cli.models:models",
    "query": "fusionrag_llm.cli.query:query",
    "serve": "fusionrag_llm.cli.serve:serve",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module), attribute)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log progress and timings.")
@click.version_option(package_name="fusionrag_llm")
def cli(verbose: bool) -> None:
    """Answer questions over retrieved documents with a local LLM, reusing fused chunk KV caches."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def main() -> None:
    cli(prog_name="fusionrag")
