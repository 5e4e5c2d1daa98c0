"""Question-answering examples and the MuSiQue (LongBench selection) loader.

The file format (``shared/data/README.md``) is a JSON list of objects with ``question``,
``answers`` (list of str) and ``ctxs`` (list of ``{"title", "text"}``); ``answers`` and ``ctxs``
may be the string form of a Python list. Optional per-entry ``id``/``_id`` and per-passage
``is_supporting`` flags are honoured when present. The shared ``musique_dev.json`` has neither:
its 10 passages carry no supporting marks (and empty titles), so examples loaded from it have
``supporting=None`` and ``passages=N`` keeps the first N passages in file order.

Example:
    >>> path = default_musique_path()
    >>> examples = load_musique(path, limit=2, passages=4) if path else []
    >>> all(len(ex.passages) == 4 for ex in examples)
    True
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusionrag_llm.errors import FusionRAGError

MUSIQUE_FILENAME = "musique_dev.json"


class DatasetError(FusionRAGError):
    """A dataset file is unreadable or does not follow the expected format."""


class DatasetFileNotFoundError(DatasetError, FileNotFoundError):
    """The dataset file does not exist (catchable as ``ValueError`` or ``FileNotFoundError``)."""


@dataclass(frozen=True)
class Passage:
    """One retrieved passage.

    Example:
        >>> Passage(title="Paris", text="Paris is the capital of France.").title
        'Paris'
    """

    title: str
    text: str


@dataclass(frozen=True)
class QAExample:
    """A question with its gold answers and retrieved passages (checked where they are read: ``load_musique``).

    ``supporting`` lists the indices (into ``passages``) of the passages needed to answer, or is
    ``None`` when the source does not say.

    Example:
        >>> ex = QAExample("q1", "Capital of France?", ["Paris"], [Passage("", "Paris ...")], (0,))
        >>> ex.answers
        ['Paris']
    """

    id: str
    question: str
    answers: list[str]
    passages: list[Passage]
    supporting: tuple[int, ...] | None = None


def default_musique_path() -> Path | None:
    """Path of ``../shared/data/musique_dev.json`` if it exists, else ``None``.

    Looked up relative to the current working directory first, then to the repository that
    holds this package.

    Example:
        >>> p = default_musique_path()
        >>> p is None or p.name == "musique_dev.json"
        True
    """
    repo_root = Path(__file__).resolve().parents[2]
    for base in (Path.cwd(), repo_root):
        candidate = base.parent / "shared" / "data" / MUSIQUE_FILENAME
        if candidate.is_file():
            return candidate.resolve()
    return None


def _check_count(name: str, value: int | None, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be None or an int >= {minimum}, got {value!r}")


def load_musique(
    path: str | Path, limit: int | None = None, passages: int | None = None, skip: int = 0
) -> list[QAExample]:
    """Load QA examples from a MuSiQue/LongBench-format JSON file.

    ``skip`` drops the first ``skip`` questions, then ``limit`` keeps the next ``limit`` (ids keep
    their place in the file). ``passages=N`` keeps N passages per question:
    when passages carry ``is_supporting`` marks, the supporting ones are kept first and the rest
    filled with distractors, all in file order (if more than N are supporting, the first N
    supporting ones are kept); without marks, the first N in file order. A question with fewer
    than N passages keeps all of them. ``answers`` may be a list, its Python repr (parsed with
    ``ast.literal_eval``) or a plain string (one answer). Ids come from ``id``/``_id`` when
    present, else ``musique-<index>``. Bad files raise :class:`DatasetError` (a ``ValueError``).

    Example:
        >>> path = default_musique_path()
        >>> len(load_musique(path, limit=3)) if path else 3
        3
    """
    _check_count("limit", limit, 0)
    _check_count("passages", passages, 1)
    _check_count("skip", skip, 0)
    entries = _read_json_list(Path(path))
    end = None if limit is None else skip + limit
    return [_parse_entry(entries[i], i, passages, path) for i in range(len(entries))[skip:end]]


def _read_json_list(path: Path) -> list[Any]:
    if not path.is_file():
        raise DatasetFileNotFoundError(
            f"dataset file {str(path)!r} not found; pass the path of a MuSiQue-format JSON file "
            f"(default location: ../shared/data/{MUSIQUE_FILENAME} next to the checkout)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not valid UTF-8 JSON ({exc})") from exc
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of questions, got {type(data).__name__}")
    return data


def _parse_entry(entry: Any, index: int, keep: int | None, path: str | Path) -> QAExample:
    where = f"{path}: entry {index}"
    if not isinstance(entry, dict):
        raise DatasetError(f"{where}: expected an object, got {type(entry).__name__}")
    for key in ("question", "answers", "ctxs"):
        if key not in entry:
            raise DatasetError(
                f"{where}: missing field {key!r} (required: question, answers, ctxs)"
            )
    question = entry["question"]
    if not isinstance(question, str) or not question.strip():
        raise DatasetError(f"{where}: 'question' must be a non-empty string")
    answers = _parse_answers(entry["answers"], where)
    passages, flags = _parse_ctxs(entry["ctxs"], where)
    passages, supporting = _select_passages(passages, flags, keep)
    example_id = str(entry.get("id", entry.get("_id", f"musique-{index}")))
    return QAExample(example_id, question, answers, passages, supporting)


def _maybe_literal(value: Any, field: str, where: str) -> Any:
    # Some exports store lists as their Python repr ("['a', 'b']").
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError) as exc:
            raise DatasetError(f"{where}: {field!r} looks like a list but does not parse") from exc
    return value


def _parse_answers(raw: Any, where: str) -> list[str]:
    value = _maybe_literal(raw, "answers", where)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise DatasetError(f"{where}: 'answers' must be a non-empty list of strings, got {raw!r}")
    return value


def _parse_ctxs(raw: Any, where: str) -> tuple[list[Passage], list[bool] | None]:
    value = _maybe_literal(raw, "ctxs", where)
    if not isinstance(value, list):
        raise DatasetError(
            f"{where}: 'ctxs' must be a list of passages, got {type(value).__name__}"
        )
    passages, flags = [], []
    for j, ctx in enumerate(value):
        if not isinstance(ctx, dict) or not isinstance(ctx.get("text"), str):
            raise DatasetError(f"{where}: ctxs[{j}] must be an object with a string 'text'")
        title = ctx.get("title") or ""
        if not isinstance(title, str):
            raise DatasetError(f"{where}: ctxs[{j}] 'title' must be a string")
        passages.append(Passage(title=title, text=ctx["text"]))
        flags.append(ctx.get("is_supporting"))
    if all(f is None for f in flags):
        return passages, None
    return passages, [bool(f) for f in flags]


def _select_passages(
    passages: list[Passage], flags: list[bool] | None, keep: int | None
) -> tuple[list[Passage], tuple[int, ...] | None]:
    if flags is None:
        return (passages if keep is None else passages[:keep]), None
    chosen = range(len(passages))
    if keep is not None:
        support = [i for i, f in enumerate(flags) if f][:keep]
        fill = [i for i, f in enumerate(flags) if not f][: keep - len(support)]
        chosen = sorted(support + fill)
    kept = [passages[i] for i in chosen]
    supporting = tuple(new for new, old in enumerate(chosen) if flags[old])
    return kept, supporting
