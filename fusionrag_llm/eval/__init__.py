"""Evaluation helpers: answer and fidelity metrics, QA datasets, synthetic multi-hop data.

* :mod:`~fusionrag_llm.eval.metrics` -- SQuAD EM/F1, KL to Full Attention, first-token agreement,
  greedy exact match, and the normalised score of the FusionRAG paper (eq. 11).
* :mod:`~fusionrag_llm.eval.datasets` -- ``QAExample``/``Passage`` and the MuSiQue loader.
* :mod:`~fusionrag_llm.eval.synthetic` -- seeded two-hop questions over invented entities.

Example:
    >>> from fusionrag_llm.eval import f1_score, make_synthetic
    >>> ex = make_synthetic(num_questions=1, passages_per_question=3, seed=0)[0]
    >>> f1_score(ex.answers[0], ex.answers)
    1.0
"""

from fusionrag_llm.eval.datasets import (
    DatasetError,
    DatasetFileNotFoundError,
    Passage,
    QAExample,
    default_musique_path,
    load_musique,
)
from fusionrag_llm.eval.metrics import (
    exact_match,
    f1_score,
    first_token_agreement,
    greedy_exact_match,
    kl_divergence,
    mean_kl,
    normalize_answer,
    normalized_score,
)
from fusionrag_llm.eval.synthetic import make_synthetic

__all__ = [
    "DatasetError",
    "DatasetFileNotFoundError",
    "Passage",
    "QAExample",
    "default_musique_path",
    "exact_match",
    "f1_score",
    "first_token_agreement",
    "greedy_exact_match",
    "kl_divergence",
    "load_musique",
    "make_synthetic",
    "mean_kl",
    "normalize_answer",
    "normalized_score",
]
