"""Synthetic two-hop data: determinism, shape, and that answering needs both hop passages."""

import doctest
import re

import pytest

from fusionrag_llm.eval import synthetic
from fusionrag_llm.eval.synthetic import make_synthetic

BORN = re.compile(r"(\w+) was born in the city of (\w+)\.")
CAPITAL = re.compile(r"(\w+) is the capital of (\w+)\.")


def _mentions(passages, name):
    return [i for i, p in enumerate(passages) if re.search(rf"\b{name}\b", p.text)]


def test_same_seed_same_data_other_seed_other_data():
    a = make_synthetic(5, 6, seed=3, words_per_passage=50)
    assert a == make_synthetic(5, 6, seed=3, words_per_passage=50)
    assert a != make_synthetic(5, 6, seed=4, words_per_passage=50)


def test_shape_and_lengths():
    examples = make_synthetic(4, 7, seed=0, words_per_passage=80)
    assert len(examples) == 4
    assert len({ex.id for ex in examples}) == 4
    for ex in examples:
        assert len(ex.passages) == 7
        assert len(ex.answers) == 1
        assert all(len(p.text.split()) >= 80 for p in ex.passages)
        assert all(len(p.text.split()) < 80 + 15 for p in ex.passages)  # one sentence overshoot


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_answer_needs_two_different_passages(seed):
    for ex in make_synthetic(6, 5, seed=seed, words_per_passage=60):
        person = re.fullmatch(r"In which country was (\w+) born\?", ex.question).group(1)
        answer = ex.answers[0]
        born = [(i, m) for i, p in enumerate(ex.passages) for m in BORN.finditer(p.text)
                if m.group(1) == person]
        assert len(born) == 1
        hop1, city = born[0][0], born[0][1].group(2)
        capital = [(i, m) for i, p in enumerate(ex.passages) for m in CAPITAL.finditer(p.text)
                   if m.group(1) == city]
        assert len(capital) == 1
        hop2 = capital[0][0]
        assert capital[0][1].group(2) == answer
        assert hop1 != hop2
        assert ex.supporting == tuple(sorted((hop1, hop2)))
        # Neither hop alone gives the answer: the person is only in hop 1, the answer only in
        # hop 2, and the city (the bridge) only in the two hops.
        assert _mentions(ex.passages, person) == [hop1]
        assert _mentions(ex.passages, answer) == [hop2]
        assert _mentions(ex.passages, city) == sorted([hop1, hop2])


def test_hops_land_in_varied_positions():
    positions = {ex.supporting for ex in make_synthetic(30, 6, seed=11, words_per_passage=20)}
    assert len(positions) > 3


def test_distractors_reuse_the_templates_with_other_entities():
    ex = make_synthetic(1, 10, seed=5, words_per_passage=30)[0]
    facts = sum(len(BORN.findall(p.text)) + len(CAPITAL.findall(p.text)) for p in ex.passages)
    assert facts == 10  # one fact per passage; 8 of them are distractors


def test_names_unique_across_questions():
    examples = make_synthetic(20, 4, seed=9, words_per_passage=10)
    titles = [p.title for ex in examples for p in ex.passages]
    assert len(titles) == len(set(titles))
    answers = [ex.answers[0] for ex in examples]
    assert len(answers) == len(set(answers))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_questions": -1}, "num_questions must be an int >= 0"),
    ({"passages_per_question": 1}, "passages_per_question must be an int >= 2"),
    ({"words_per_passage": 0}, "words_per_passage must be an int >= 1"),
    ({"seed": 1.5}, "seed must be an int"),
])
def test_bad_arguments(kwargs, message):
    args = {"num_questions": 2, "passages_per_question": 3, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=message):
        make_synthetic(**args)


def test_docstring_examples_run():
    result = doctest.testmod(synthetic)
    assert result.failed == 0 and result.attempted > 0
