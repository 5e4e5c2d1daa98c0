"""Seeded synthetic two-hop QA data over invented entities.

Each question "In which country was <person> born?" needs two passages: one says
"<person> was born in the city of <city>." and another says "<city> is the capital of <country>."
The person appears only in the first, the country (the answer) only in the second, and the city
only in those two. Remaining passages are distractors about other invented entities, written with
the same templates, so that matching words is not enough. Every passage is padded with filler
sentences about its own subject, and the passages are shuffled; ``supporting`` records where the
two hops landed. Names are built from 2-4 syllables and are unique within one call.

Example:
    >>> ex = make_synthetic(num_questions=1, passages_per_question=4, seed=0)[0]
    >>> len(ex.passages), len(ex.supporting)
    (4, 2)
"""

from __future__ import annotations

import random

from fusionrag_llm.eval.datasets import Passage, QAExample

_SYLLABLES = (
    "ka", "lo", "mi", "ra", "ten", "vu", "shi", "dor", "bel", "qua", "zin", "fo", "gar",
    "nel", "pra", "sol", "tu", "wex", "yan", "mor", "lis", "dra", "kel", "vo", "rim",
)
_PERSON_FILLER = (
    "{e} worked for many years as a {job}.",
    "{e} was fond of {hobby}.",
    "Friends remember {e} as a {trait} person.",
    "In later life {e} wrote a short book about {hobby}.",
    "{e} once won a local prize for {hobby}.",
)
_PLACE_FILLER = (
    "{e} is known for its {thing}.",
    "Visitors to {e} often praise the {thing}.",
    "The climate of {e} is {weather} for most of the year.",
    "{e} holds a yearly festival celebrating its {thing}.",
    "Many people in {e} earn a living from {trade}.",
)
_WORDS = {
    "job": ("baker", "carpenter", "teacher", "sailor", "clerk", "weaver", "surveyor"),
    "hobby": ("chess", "gardening", "painting", "fishing", "astronomy", "pottery"),
    "trait": ("patient", "cheerful", "quiet", "stubborn", "generous", "curious"),
    "thing": ("old bridges", "river markets", "stone towers", "spice gardens", "music halls"),
    "weather": ("mild", "humid", "dry", "windy", "cool", "warm"),
    "trade": ("fishing", "farming", "weaving", "mining", "shipbuilding", "trading tea"),
}


class _NameMaker:
    """Draws invented capitalised names, never repeating one within a generator run."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._used: set[str] = set()

    def __call__(self) -> str:
        while True:
            parts = self._rng.randint(2, 4)
            name = "".join(self._rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()
            if name not in self._used:
                self._used.add(name)
                return name


def _passage(
    rng: random.Random, fact: str, subject: str, templates: tuple[str, ...], words: int
) -> Passage:
    """One fact sentence at a random position among filler about ``subject``."""
    # Cycle through the templates in a shuffled order so a passage repeats itself as little
    # as possible (no "mild" and "cool" climate in the same passage until all were used).
    order = rng.sample(templates, len(templates))
    sentences, count = [fact], len(fact.split())
    while count < words:
        template = order[(len(sentences) - 1) % len(order)]
        fill = {key: rng.choice(options) for key, options in _WORDS.items()}
        sentence = template.format(e=subject, **fill)
        sentences.insert(rng.randint(0, len(sentences)), sentence)
        count += len(sentence.split())
    return Passage(title=subject, text=" ".join(sentences))


def _distractor(rng: random.Random, name: _NameMaker, words: int) -> Passage:
    """A passage with the same shape as a hop, about entities used nowhere else."""
    if rng.random() < 0.5:
        person, city = name(), name()
        fact = f"{person} was born in the city of {city}."
        return _passage(rng, fact, person, _PERSON_FILLER, words)
    city, country = name(), name()
    return _passage(rng, f"{city} is the capital of {country}.", city, _PLACE_FILLER, words)


def _check_args(num_questions: int, passages_per_question: int, seed: int, words: int) -> None:
    checks = (
        ("num_questions", num_questions, 0),
        ("passages_per_question", passages_per_question, 2),
        ("words_per_passage", words, 1),
    )
    for arg, value, minimum in checks:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{arg} must be an int >= {minimum}, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")


def make_synthetic(
    num_questions: int,
    passages_per_question: int,
    seed: int,
    words_per_passage: int = 60,
) -> list[QAExample]:
    """Generate ``num_questions`` two-hop questions, each with its own passages.

    ``passages_per_question`` (>= 2) counts the two hop passages plus distractors. Each passage
    has at least ``words_per_passage`` words (one sentence may overshoot it). The same arguments
    always give the same examples.

    Example:
        >>> a = make_synthetic(2, 3, seed=7)
        >>> a == make_synthetic(2, 3, seed=7)
        True
        >>> a[0].question.startswith("In which country was ")
        True
    """
    _check_args(num_questions, passages_per_question, seed, words_per_passage)
    rng = random.Random(seed)
    name = _NameMaker(rng)
    examples = []
    for q in range(num_questions):
        person, city, country = name(), name(), name()
        hops = [
            _passage(rng, f"{person} was born in the city of {city}.", person,
                     _PERSON_FILLER, words_per_passage),
            _passage(rng, f"{city} is the capital of {country}.", city,
                     _PLACE_FILLER, words_per_passage),
        ]
        others = [_distractor(rng, name, words_per_passage)
                  for _ in range(passages_per_question - 2)]
        order = list(range(passages_per_question))
        rng.shuffle(order)
        pool = hops + others
        passages = [pool[i] for i in order]
        supporting = tuple(sorted((order.index(0), order.index(1))))
        examples.append(QAExample(
            id=f"synthetic-{seed}-{q}",
            question=f"In which country was {person} born?",
            answers=[country],
            passages=passages,
            supporting=supporting,
        ))
    return examples
