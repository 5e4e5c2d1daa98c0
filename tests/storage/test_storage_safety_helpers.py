"""Helpers of the storage safety tests (no tests here): hand-made cache.db rows, entry files, mounts, payloads."""

from __future__ import annotations

import os
import pickle
import shutil
import sqlite3
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from fusionrag_llm.storage import entry_files


class _CreatesFile:
    """Unpickling an instance calls `open(path, "w")`: the file appears if anything unpickles it."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def pickle_payload(marker: Path) -> bytes:
    return pickle.dumps(_CreatesFile(str(marker)))


def insert_row(directory: Path, *, key, size=0, heat=0.0, value=None) -> int:
    """Insert one row into the store's index by hand, as an attacker with write access could."""
    con = sqlite3.connect(directory / "cache.db")
    try:
        with con:
            cur = con.execute("INSERT INTO entries(key, size, heat, value) VALUES (?, ?, ?, ?)", (key, size, heat, value))
        return cur.lastrowid
    finally:
        con.close()


def sql(directory: Path, statement: str, params: tuple = ()) -> list[tuple]:
    con = sqlite3.connect(directory / "cache.db")
    try:
        with con:
            return con.execute(statement, params).fetchall()
    finally:
        con.close()


def row_ids(directory: Path) -> set[int]:
    return {rowid for (rowid,) in sql(directory, "SELECT rowid FROM entries")}


def stored_file(directory: Path, key: str) -> Path | None:
    """The file holding `key`'s value (None: it lives inside cache.db); the file is named after its key."""
    found = [p for p in directory.rglob(f"{key}.val") if p.is_file()]
    return found[0] if found else None


def unreferenced_files(directory: Path) -> set[str]:
    """Files in the entry layout no row names (what a failed write must not leave behind)."""
    named = {key for (key,) in sql(directory, "SELECT key FROM entries WHERE value IS NULL")}
    return {name for name in entry_files(directory) if name.split("/")[-1].removesuffix(".val") not in named}


def orphan_name(n: int = 0) -> str:
    """A path in the entry-file layout (`ab/<key>.val`) of a key no entry has."""
    key = f"{n + 0xab:064x}"
    return f"{key[:2]}/{key}.val"


def _run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True)


@contextmanager
def mounted(target: Path, *, tmpfs_size: str | None = None, read_only_of: Path | None = None):
    """A small tmpfs, or a read-only bind mount of `read_only_of`, at `target`; skip when not permitted."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    target.mkdir(parents=True, exist_ok=True)
    if tmpfs_size is not None:
        steps = [["mount", "-t", "tmpfs", "-o", f"size={tmpfs_size}", "tmpfs", str(target)]]
    else:
        steps = [["mount", "--bind", str(read_only_of), str(target)], ["mount", "-o", "remount,ro,bind", str(target)]]
    for i, step in enumerate(steps):
        done = _run(step)
        if done.returncode != 0:
            if i:
                _run(["umount", str(target)])
            pytest.skip(f"mounting is not permitted here (needs root with CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield target
    finally:
        if _run(["umount", str(target)]).returncode != 0:
            _run(["umount", "-l", str(target)])


def is_read_only_mount(path: Path) -> bool:
    return not os.access(path, os.W_OK)
