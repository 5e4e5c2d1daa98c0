"""``fusionrag models list|rm``: the models converted for the engine (a GGUF file or the default model,
kept under ``<cache>/models``), with their sizes; removing one frees its disk, and the next load of
its source converts it again."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import click


def _models_dir() -> Path:
    from fusionrag_llm.paths import cache_dir

    return cache_dir() / "models"


def _size(folder: Path) -> int:
    """Bytes of the regular files under ``folder`` (links are not followed)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            info = os.lstat(os.path.join(root, name))
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


@click.group()
def models() -> None:
    """The converted models in the cache folder ($FUSIONRAG_CACHE/models)."""


@models.command("list")
def list_models() -> None:
    """Each converted model: its name, size and whether its conversion is complete."""
    from fusionrag_llm import conversion_source

    folder = _models_dir()
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    if not entries:
        click.echo(f"no converted models in {folder}")
        return
    total = 0
    for entry in entries:
        if entry.is_symlink() or not entry.is_dir():
            click.echo(f"{entry.name:<28} {'-':>10}  not a model folder (left alone by list; rm removes it)")
            continue
        size = _size(entry)
        total += size
        source = conversion_source(entry)
        state = f"complete (from GGUF sha256 {source[:12]})" if source else "incomplete: converted again on next load"
        click.echo(f"{entry.name:<28} {size / 2**20:8.1f} MiB  {state}")
    click.echo(f"{len(entries)} entries, {total / 2**20:.1f} MiB in {folder}")


@models.command("rm")
@click.argument("names", nargs=-1, required=True)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def remove_models(names: tuple[str, ...], yes: bool) -> None:
    """Remove the converted models NAMES (as `fusionrag models list` shows them)."""
    folder = _models_dir()
    targets = []
    for name in names:
        path = folder / name
        if not name or name in (".", "..") or "/" in name or os.sep in name:
            raise click.BadParameter(f"{name!r} is not a model name: give a name as `fusionrag models list` shows it")
        if not path.is_symlink() and not path.exists():
            raise click.ClickException(f"no converted model {name!r} in {folder} (see `fusionrag models list`)")
        targets.append(path)
    if not yes:
        click.confirm(f"remove {', '.join(names)} from {folder}?", abort=True)
    for path in targets:
        if path.is_symlink() or not path.is_dir():  # a link is removed, never what it points to
            path.unlink()
        else:
            shutil.rmtree(path)
        click.echo(f"removed {path.name}")
