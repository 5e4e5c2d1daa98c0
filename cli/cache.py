"""``fusionrag cache stats|verify|clear``: inspect, check and empty a KV store folder."""

from __future__ import annotations

from pathlib import Path

import click

from fusionrag_llm.fusion.catalog import CATALOG_FILE
from fusionrag_llm.paths import store_dir


def _open(folder: str | None):
    from fusionrag_llm.storage import TieredStore

    path = Path(folder).expanduser() if folder else store_dir()
    if not path.is_dir():
        raise click.ClickException(f"no KV store at {str(path)!r} (ingest something first, or pass --store)")
    return path, TieredStore(path)


store_option = click.option("--store", "folder", default=None, help="Store folder (default: $FUSIONRAG_STORE or the user cache).")


@click.group()
def cache() -> None:
    """Inspect, verify or clear the KV store."""


@cache.command()
@store_option
def stats(folder: str | None) -> None:
    """Entries and bytes per tier, and the registered chunks."""
    path, store = _open(folder)
    with store:
        summary = store.stats()
        disk = summary.tiers.get("disk")
        click.echo(f"store: {path}")
        click.echo(f"entries on disk: {disk.entries if disk else 0}  ({(disk.bytes if disk else 0) / 2**20:.1f} MiB)")
    catalog = path / CATALOG_FILE
    chunks = sum(1 for _ in open(catalog, encoding="utf-8")) if catalog.is_file() else 0
    click.echo(f"registered chunks: {chunks}")


@cache.command()
@store_option
def verify(folder: str | None) -> None:
    """Check every entry's checksum; corrupt entries are removed and listed."""
    path, store = _open(folder)
    with store:
        report = store.verify()
    click.echo(f"checked {report.checked} entries in {path}: {len(report.corrupt)} corrupt")
    for key in report.corrupt:
        click.echo(f"  removed corrupt entry {key}")
    if report.corrupt:
        raise SystemExit(1)


@cache.command()
@store_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def clear(folder: str | None, yes: bool) -> None:
    """Remove every entry and the chunk catalog."""
    path, store = _open(folder)
    if not yes:
        click.confirm(f"remove every entry in {path}?", abort=True)
    with store:
        count = len(store.keys())
        store.clear()
    (path / CATALOG_FILE).unlink(missing_ok=True)
    click.echo(f"removed {count} entries from {path}")
