"""An append-only JSON-lines log of benchmark records, so an interrupted run resumes where it stopped.

The first line is ``{"config": {...}}``: the settings that change a record's value. Each further
line is one record, keyed by ``(qid, method, ratio)``. Reopening the log with a different config
raises ``ValueError`` naming the differing fields (delete the log to start over); a
truncated last line (a run killed mid-write) is ignored.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "x.partial.jsonl"
    >>> log = PartialLog(path, {"seed": 0})
    >>> log.append({"qid": "q1", "method": "fusionrag", "ratio": 0.15, "f1": 1.0})
    >>> PartialLog(path, {"seed": 0}).has(("q1", "fusionrag", 0.15))
    True
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from fusionrag_llm.eval.results import json_safe

logger = logging.getLogger(__name__)

RecordKey = tuple[str, str, float | None]


def record_key(record: dict[str, Any]) -> RecordKey:
    return (record["qid"], record["method"], record["ratio"])


class PartialLog:
    """Records already computed under ``config``, plus an ``append`` that persists new ones."""

    def __init__(self, path: str | Path, config: dict[str, Any]):
        self.path = Path(path)
        self.config = json_safe(config)
        self._records: dict[RecordKey, dict[str, Any]] = {}
        if self.path.exists() and self.path.stat().st_size > 0:
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"config": self.config}) + "\n")

    def _load(self) -> None:
        lines = self.path.read_text().splitlines()
        try:
            header = json.loads(lines[0])["config"]
        except (json.JSONDecodeError, KeyError, TypeError, IndexError):
            raise ValueError(f"{self.path} is not a benchmark log (bad first line); delete it to start over") from None
        if header != self.config:
            differing = sorted(k for k in set(header) | set(self.config) if header.get(k) != self.config.get(k))
            raise ValueError(
                f"{self.path} was written with a different configuration (differs in: {', '.join(differing)}); "
                "delete it to start over, or choose another --out folder"
            )
        for number, line in enumerate(lines[1:], start=2):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("%s line %d is truncated; ignoring it", self.path, number)
                continue
            self._records[record_key(record)] = record
        self._drop_torn_tail()

    def _drop_torn_tail(self) -> None:
        # A run killed mid-write leaves a line without "\n"; terminate it so appends stay parseable.
        text = self.path.read_bytes()
        if text and not text.endswith(b"\n"):
            with self.path.open("ab") as handle:
                handle.write(b"\n")

    def __len__(self) -> int:
        return len(self._records)

    def has(self, key: RecordKey) -> bool:
        return key in self._records

    def get(self, key: RecordKey) -> dict[str, Any] | None:
        return self._records.get(key)

    def append(self, record: dict[str, Any]) -> None:
        record = json_safe(record)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record, allow_nan=False) + "\n")
            handle.flush()
        self._records[record_key(record)] = record
