"""MuSiQue loader on the shared file and on small hand-written files, including bad input."""

import doctest
import json
import os
from pathlib import Path

import pytest

from fusionrag_llm.eval import datasets
from fusionrag_llm.eval.datasets import (
    DatasetError,
    Passage,
    default_musique_path,
    load_musique,
)

SHARED = default_musique_path()
needs_shared = pytest.mark.skipif(
    SHARED is None, reason="../shared/data/musique_dev.json not found next to the checkout"
)


def _write(tmp_path: Path, data, name="data.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def _entry(n_ctx=3, **overrides):
    entry = {
        "question": "Who wrote it?",
        "answers": "['Thomas Nabbes', 'Nabbes']",
        "ctxs": str([{"title": f"T{i}", "text": f"passage {i}"} for i in range(n_ctx)]),
    }
    entry.update(overrides)
    return entry


@needs_shared
def test_shared_file_loads_fully():
    examples = load_musique(SHARED)
    assert len(examples) == 100
    assert len({ex.id for ex in examples}) == 100
    for ex in examples:
        assert ex.question.strip() and ex.answers
        assert len(ex.passages) == 10
        assert all(p.text for p in ex.passages)
        assert ex.supporting is None  # the shared file does not mark supporting passages
    assert examples[0].answers == ["Exeter College"]


@needs_shared
def test_shared_file_limit_and_passages_keep_file_order():
    full = load_musique(SHARED, limit=5)
    cut = load_musique(SHARED, limit=5, passages=4)
    assert len(cut) == 5
    for a, b in zip(full, cut):
        assert b.passages == a.passages[:4]
        assert (b.id, b.question, b.answers) == (a.id, a.question, a.answers)


def test_stringified_lists_are_parsed(tmp_path):
    path = _write(tmp_path, [_entry(), _entry(answers=["plain"], id="q-7")])
    first, second = load_musique(path)
    assert first.answers == ["Thomas Nabbes", "Nabbes"]
    assert first.passages == [Passage(f"T{i}", f"passage {i}") for i in range(3)]
    assert first.id == "musique-0"
    assert (second.id, second.answers) == ("q-7", ["plain"])


def test_plain_string_answer_becomes_one_answer(tmp_path):
    path = _write(tmp_path, [_entry(answers="Paris")])
    assert load_musique(path)[0].answers == ["Paris"]


def test_limit_and_passages(tmp_path):
    path = _write(tmp_path, [_entry(), _entry(), _entry()])
    assert len(load_musique(path, limit=2)) == 2
    assert load_musique(path, limit=0) == []
    assert [p.title for p in load_musique(path, passages=2)[0].passages] == ["T0", "T1"]
    assert len(load_musique(path, passages=10)[0].passages) == 3  # fewer available: keep all


def test_supporting_marks_are_kept_and_filled_with_distractors(tmp_path):
    ctxs = [
        {"title": f"T{i}", "text": f"p{i}", "is_supporting": i in (3, 5)} for i in range(6)
    ]
    path = _write(tmp_path, [_entry(ctxs=ctxs)])
    full = load_musique(path)[0]
    assert full.supporting == (3, 5)
    cut = load_musique(path, passages=3)[0]
    # Supporting T3, T5 plus the first distractor T0, in file order.
    assert [p.title for p in cut.passages] == ["T0", "T3", "T5"]
    assert cut.supporting == (1, 2)
    only = load_musique(path, passages=1)[0]
    assert [p.title for p in only.passages] == ["T3"] and only.supporting == (0,)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_musique(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="not found"):  # also a ValueError
        load_musique(tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid UTF-8 JSON"),
        ({"question": "q"}, "expected a JSON list"),
        (["text"], "expected an object"),
        ([{"question": "q", "answers": ["a"]}], "missing field 'ctxs'"),
        ([_entry(question="")], "'question' must be a non-empty string"),
        ([_entry(answers=[])], "'answers' must be a non-empty list"),
        ([_entry(answers="['unclosed'")], "does not parse"),
        ([_entry(ctxs="[{'title': 'x'}]")], r"ctxs\[0\] must be an object with a string 'text'"),
        ([_entry(ctxs={"a": 1})], "'ctxs' must be a list"),
    ],
)
def test_bad_files_raise_dataset_error(tmp_path, content, message):
    path = _write(tmp_path, content)
    with pytest.raises(DatasetError, match=message):
        load_musique(path)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"limit": -1}, "limit must be None or an int >= 0"),
    ({"passages": 0}, "passages must be None or an int >= 1"),
    ({"passages": True}, "passages must be None or an int >= 1"),
])
def test_bad_arguments(tmp_path, kwargs, message):
    path = _write(tmp_path, [_entry()])
    with pytest.raises(ValueError, match=message):
        load_musique(path, **kwargs)


def test_default_path_found_from_cwd(tmp_path, monkeypatch):
    data = tmp_path / "shared" / "data"
    data.mkdir(parents=True)
    (data / "musique_dev.json").write_text("[]")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    # The working directory is looked at before the repository.
    assert default_musique_path() == (data / "musique_dev.json").resolve()


def test_default_path_is_none_when_absent(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets, "__file__", os.fspath(tmp_path / "a" / "b" / "datasets.py"))
    assert default_musique_path() is None


def test_docstring_examples_run():
    result = doctest.testmod(datasets)
    assert result.failed == 0 and result.attempted > 0
