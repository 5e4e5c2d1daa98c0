"""Lines of the JSON record logs that several processes share (the chunk catalog, the document index).

Read as bytes, a line at a time: a line that is not UTF-8 or not a JSON object is the caller's to
skip with a warning, never a reason to stop reading the others. Only whole lines are read; a torn
last line (a writer killed mid-write) waits for its newline, and the log's next writer ends it
first (``storage.record_log``) so that its own lines stay whole.
"""

from __future__ import annotations

import errno
import json

_WRITE_PROBLEMS = {
    errno.EROFS: "the folder is on a read-only file system",
    errno.EACCES: "no permission to write there",
    errno.EPERM: "no permission to write there",
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exhausted",
}


def whole_lines(data: bytes) -> tuple[list[bytes], int]:
    """The complete lines of ``data`` (without newlines) and how many bytes they span."""
    end = data.rfind(b"\n") + 1
    return data[:end].split(b"\n")[:-1], end


def parse_line(raw: bytes) -> dict:
    """One line as a JSON object; ``ValueError`` (incl. ``UnicodeDecodeError``) when it is not one."""
    record = json.loads(raw.decode("utf-8"))
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    return record


def why_unreadable(exc: Exception) -> str:
    """A short reason for a warning about a skipped line."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 (byte {exc.start})"
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON ({exc.msg})"
    if isinstance(exc, KeyError):
        return f"a field is missing ({exc.args[0]!r})"
    return f"not a valid record ({exc})"


def write_problem(exc: OSError) -> str:
    """What went wrong when a log could not be written, in a user's words."""
    return _WRITE_PROBLEMS.get(exc.errno, exc.strerror or type(exc).__name__)
