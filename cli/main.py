"""The ``fusionrag`` command group; each command lives in its own module."""

from __future__ import annotations

import logging

import click

from fusionrag_llm.cli.demo import demo


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log progress and timings.")
@click.version_option(package_name="fusionrag_llm")
def cli(verbose: bool) -> None:
    """Answer questions over retrieved documents with a local LLM, reusing fused chunk KV caches."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


cli.add_command(demo)


def main() -> None:
    cli(prog_name="fusionrag")
