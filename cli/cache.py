"""``fusionrag cache stats|verify|clear``: inspect, check, repair and empty a KV store folder.

A damaged index never ends in a traceback: ``stats`` reports it, ``verify --repair`` rebuilds it from
the entry files and ``clear --yes`` starts empty; both keep the damaged file as
``cache.db.damaged-<time>``. ``verify`` exits 0 when the store is clean or ``--repair`` repaired every
problem it found, and 1 when problems remain (its output says what was found and what was repaired).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from fusionrag_llm import CATALOG_FILE, TENANT_CATALOGS, recorded_kv_codec, registered_chunk_count
from fusionrag_llm.ingest.doc_index import DOCUMENTS_LOG, LEGACY_FOLDER, TENANT_DOCUMENTS, DocumentIndex
from fusionrag_llm.paths import remote_secret, remote_trusted, store_dir
from fusionrag_llm.storage import (
    FileRecordLog,
    StoreConfigError,
    StoreDamagedError,
    StoreOptions,
    StoreWriteError,
    TieredStore,
    VerifyReport,
    clear_damaged,
    entry_files,
    rebuild_index,
)

store_option = click.option(
    "--store", "folder", default=None, help="Store folder (default: $FUSIONRAG_STORE or the user cache)."
)
remote_option = click.option(
    "--remote", default=None, metavar="URL",
    help="Also the shared Redis tier at URL (only when given here: $FUSIONRAG_REMOTE is not read by cache commands), "
         "with $FUSIONRAG_REMOTE_SECRET (or $FUSIONRAG_REMOTE_TRUSTED=1).",
)  # fmt: skip


def _options(remote: str | None) -> StoreOptions:
    try:
        if remote is None:
            return StoreOptions()
        return StoreOptions(remote_url=remote, remote_secret=remote_secret(), remote_trusted=remote_trusted())
    except ValueError as exc:
        raise click.ClickException(f"--remote: {exc}") from None


def _folder(folder: str | None) -> Path:
    path = Path(folder).expanduser() if folder else store_dir()
    if not path.is_dir():
        raise click.ClickException(f"no KV store at {str(path)!r} (ingest something first, or pass --store)")
    return path


@click.group()
def cache() -> None:
    """Inspect, verify, repair or clear the KV store."""


@cache.command()
@store_option
@remote_option
def stats(folder: str | None, remote: str | None) -> None:
    """Entries and bytes on disk (and in the remote tier), and the registered chunks (exit 1 when the index is damaged)."""
    path = _folder(folder)
    options = _options(remote)
    click.echo(f"store: {path}")
    click.echo(f"kv_codec: {_codec_line(path)}")
    damaged = None
    try:
        with TieredStore(path, options=options) as store:
            summary = store.stats()
    except StoreDamagedError as exc:
        damaged = exc
        click.echo(f"index damaged: {exc}")
        click.echo(f"entry files: {len(entry_files(path))}")
    else:
        disk = summary.tiers.get("disk")
        click.echo(f"entries on disk: {disk.entries if disk else 0}  ({(disk.bytes if disk else 0) / 2**20:.1f} MiB)")
        shared = summary.tiers.get("remote")
        if shared is not None:  # an unreachable server counts none (the log says it could not be reached)
            click.echo(f"entries in the remote tier: {shared.entries}  ({shared.bytes / 2**20:.1f} MiB)")
        if summary.read_only:
            click.echo("read-only: entries are served, new ones are not saved")
    # The catalog's own reader: it skips lines that are not UTF-8 or not chunks (fused-entry records).
    click.echo(f"registered chunks: {registered_chunk_count(path)}")
    tenants = len(list(path.glob(TENANT_CATALOGS)))
    if tenants:
        click.echo(f"  (the default tenant's; {tenants} other tenants have catalogs of their own)")
    click.echo(f"retrieval index: {len(DocumentIndex(FileRecordLog(path, DOCUMENTS_LOG)))} chunks")
    if (path / LEGACY_FOLDER).is_dir():
        click.echo(f"  (plus the older index in {path / LEGACY_FOLDER}, moved into {DOCUMENTS_LOG} by the next ingest or query)")
    if damaged is not None:
        raise SystemExit(1)


def _codec_line(path: Path) -> str:
    try:
        recorded = recorded_kv_codec(path)
    except StoreConfigError as exc:
        return f"unknown ({exc})"
    return "not recorded (a store made before records: the compute dtype)" if recorded is None else recorded


@cache.command()
@store_option
@remote_option
@click.option("--repair", is_flag=True, help="Remove every problem found; rebuild a damaged index from entry files.")
def verify(folder: str | None, remote: str | None, repair: bool) -> None:
    """Check every entry, row and entry file; corrupt entries are always removed.

    Exit status 0 when the store is clean, or with --repair once every problem found was repaired
    (a damaged index rebuilt included); 1 when problems were found and not repaired.
    """
    path = _folder(folder)
    options = _options(remote)
    try:
        with TieredStore(path, options=options) as store:
            report = store.verify(repair=repair)
    except StoreDamagedError as exc:
        _recover_index(path, exc, repair)
        raise SystemExit(0 if repair else 1) from None
    except StoreWriteError as exc:  # --repair on a read-only store
        raise click.ClickException(str(exc)) from None
    _echo_report(path, report)
    if not (report.ok or report.repaired):
        raise SystemExit(1)


def _echo_report(path: Path, report: VerifyReport) -> None:
    click.echo(
        f"checked {report.checked} entries in {path}: {len(report.corrupt)} corrupt, {len(report.stale)} stale, "
        f"{len(report.mismatched)} under another key, {len(report.missing_files)} with a missing file, "
        f"{len(report.foreign_rows)} foreign rows, {len(report.orphan_files)} orphan files"
    )
    removed = "removed" if report.repaired else "found"
    for key in report.corrupt:
        click.echo(f"  {'found' if report.read_only else 'removed'} corrupt entry {key}")
    for title, items in (("stale entry", report.stale), ("entry under another key", report.mismatched),
                         ("entry with a missing file", report.missing_files), ("foreign row", report.foreign_rows),
                         ("orphan file", report.orphan_files)):  # fmt: skip
        for item in items:
            click.echo(f"  {removed} {title} {item}")
    if report.ok:
        return
    if report.repaired:
        click.echo("problems repaired")
    elif report.read_only:
        click.echo("the store is read-only: nothing was removed")
    elif report.problems > len(report.corrupt):
        click.echo("not repaired: run 'fusionrag cache verify --repair' to remove them "
                   "(corrupt entries are always removed)")  # fmt: skip
    else:
        click.echo("corrupt entries removed")


def _recover_index(path: Path, exc: StoreDamagedError, repair: bool) -> None:
    click.echo(str(exc))
    if not repair:
        click.echo("nothing was changed")
        return
    try:
        report = rebuild_index(path)
    except StoreWriteError as error:
        raise click.ClickException(str(error)) from None
    if report.quarantined is not None:
        click.echo(f"damaged index kept as {report.quarantined}")
    click.echo(f"index rebuilt: {len(report.recovered)} entries recovered from their files")
    if report.unreadable or report.duplicates:
        click.echo(f"removed {len(report.unreadable)} unreadable and {len(report.duplicates)} duplicate entry files")
    kib = StoreOptions().disk_min_file_bytes // 1024
    small = f"small entries (under {kib} KiB) that lived inside the damaged index"
    count = report.lost_in_index
    lost = f"the {small} (how many cannot be read)" if count is None else f"{count} {small}"
    click.echo(f"lost: {lost}; they are recomputed when needed")
    click.echo("problems repaired")


@cache.command()
@store_option
@click.option("--all", "everything", is_flag=True, help="Also remove the retrieval index of `fusionrag ingest`.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def clear(folder: str | None, everything: bool, yes: bool) -> None:
    """Remove every KV entry and the chunk catalogs (every tenant's); with --all also the retrieval indexes.
    A damaged entry index is kept aside, not deleted."""
    path = _folder(folder)
    documents = [p for p in (path / DOCUMENTS_LOG, path / LEGACY_FOLDER, *path.glob(TENANT_DOCUMENTS)) if p.exists()]
    if not yes:
        extra = " and the retrieval index" if everything else ""
        click.confirm(f"remove every entry{extra} in {path}?", abort=True)
    try:
        message = _clear_entries(path)
    except StoreWriteError as exc:
        raise click.ClickException(str(exc)) from None
    for catalog in [path / CATALOG_FILE, *path.glob(TENANT_CATALOGS)]:
        catalog.unlink(missing_ok=True)  # a link is removed, never followed
    click.echo(message + "; removed the chunk catalog")
    if everything and documents:
        for log in [path / DOCUMENTS_LOG, *path.glob(TENANT_DOCUMENTS)]:
            log.unlink(missing_ok=True)  # a link is removed, never followed
        shutil.rmtree(path / LEGACY_FOLDER, ignore_errors=True)
        click.echo(f"removed the retrieval index ({', '.join(p.name for p in documents)})")
    elif documents:
        click.echo(f"kept the retrieval index ({', '.join(p.name for p in documents)}): `fusionrag query` still "
                   "retrieves from it and recomputes the KV it needs; `fusionrag cache clear --all` removes it too")  # fmt: skip


def _clear_entries(path: Path) -> str:
    try:
        with TieredStore(path, options=StoreOptions()) as store:
            count = len(store.keys())
            store.clear()
        return f"removed {count} entries from {path}"
    except StoreDamagedError:
        report = clear_damaged(path)
    kept = f"; the damaged index was kept as {report.quarantined.name}" if report.quarantined else ""
    return f"removed {len(report.cleared)} entry files from {path}{kept}"
