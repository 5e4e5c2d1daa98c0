"""Hand-computed cases for the answer, fidelity and normalised-score metrics."""

import doctest
import math

import pytest
import torch

from fusionrag_llm.eval import metrics
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


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  a  cat,  an apple & THE dog!! ", "cat apple dog"),
        ("Theatre of the Absurd", "theatre of absurd"),  # "the" only as a whole word
        ("U.S.A.", "usa"),
        ("", ""),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_exact_match_uses_normalisation_and_max_over_golds():
    assert exact_match("the Exeter College.", ["Oxford", "Exeter college"]) == 1.0
    assert exact_match("Exeter", ["Exeter College"]) == 0.0
    assert exact_match("Paris", "paris") == 1.0  # a bare string is one gold answer


def test_f1_partial_overlap_by_hand():
    # pred tokens [cat, sat, on, mat], gold [cat, sat]: P = 2/4, R = 2/2, F1 = 2/3.
    assert f1_score("the cat sat on the mat", ["a cat sat"]) == pytest.approx(2 / 3)
    # Repeated tokens count with multiplicity: pred [big, big, dog] vs gold [big, dog]:
    # common = 2, P = 2/3, R = 1, F1 = 0.8.
    assert f1_score("big big dog", ["big dog"]) == pytest.approx(0.8)


def test_f1_takes_best_gold_and_handles_empty_answers():
    assert f1_score("new york city", ["boston", "new york"]) == pytest.approx(0.8)
    assert f1_score("london", ["paris"]) == 0.0
    assert f1_score("the", ["a"]) == 1.0  # both normalise to empty
    assert f1_score("", ["paris"]) == 0.0


def test_answer_metrics_reject_bad_golds():
    with pytest.raises(ValueError, match="non-empty sequence of str"):
        f1_score("x", [])
    with pytest.raises(ValueError, match="non-empty sequence of str"):
        exact_match("x", [1])


def test_kl_of_identical_logits_is_zero():
    logits = torch.randn(4, 11, generator=torch.Generator().manual_seed(0))
    kl = kl_divergence(logits, logits.clone())
    assert kl.shape == (4,)
    assert kl.dtype == torch.float64
    assert torch.all(kl == 0)  # clamped, so exactly zero


def test_kl_two_class_by_hand():
    # P_ref = (1/2, 1/2), P_method = (3/4, 1/4):
    # KL = 1/2 ln((1/2)/(3/4)) + 1/2 ln((1/2)/(1/4)) = 1/2 ln(4/3).
    ref = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    method = torch.tensor([[math.log(3.0), 0.0]], dtype=torch.float64)
    assert kl_divergence(ref, method).item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-12)
    # KL is not symmetric: KL(method || ref) = 3/4 ln(3/2) + 1/4 ln(1/2).
    expected = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert kl_divergence(method, ref).item() == pytest.approx(expected, abs=1e-12)


def test_kl_masked_tokens_and_bf16_inputs():
    ref = torch.tensor([[0.0, -math.inf]])  # reference puts all mass on token 0
    assert kl_divergence(ref, torch.tensor([[0.0, 0.0]])).item() == pytest.approx(math.log(2))
    assert math.isinf(kl_divergence(torch.zeros(1, 2), ref).item())
    low = torch.zeros(2, 3, dtype=torch.bfloat16)
    assert kl_divergence(low, low).tolist() == [0.0, 0.0]


def test_mean_kl():
    ref = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    method = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])
    assert mean_kl(ref, method) == pytest.approx(0.25 * math.log(4 / 3))
    with pytest.raises(ValueError, match="at least one position"):
        mean_kl(torch.zeros(0, 5), torch.zeros(0, 5))


@pytest.mark.parametrize(("ref", "method"), [(torch.zeros(2, 3), torch.zeros(3, 3)), (torch.zeros(2, 0), torch.zeros(2, 0))])
def test_kl_rejects_bad_shapes(ref, method):
    with pytest.raises(ValueError, match="same shape with a non-empty last"):
        kl_divergence(ref, method)


def test_first_token_agreement_and_greedy_exact_match():
    assert first_token_agreement([5, 7, 9], [5, 8]) == 1.0
    assert first_token_agreement([5, 7], [6, 7]) == 0.0
    assert first_token_agreement([], []) == 1.0
    assert first_token_agreement([], [3]) == 0.0
    assert first_token_agreement(torch.tensor([4, 1]), [4]) == 1.0
    assert greedy_exact_match([5, 7], [5, 7]) == 1.0
    assert greedy_exact_match([5, 7], [5, 7, 2]) == 0.0
    assert greedy_exact_match(torch.tensor([1, 2]), (1, 2)) == 1.0


def test_normalized_score_regular_cases():
    assert normalized_score(0.5, x_full_reuse=0.0, x_full_attention=1.0) == 0.5
    assert normalized_score(0.712, 0.712, 0.852) == 0.0
    assert normalized_score(0.852, 0.712, 0.852) == pytest.approx(1.0)
    # The paper's example: CacheBlend F1 0.781 between FR 0.712 and FA 0.852 -> 49.3%.
    assert normalized_score(0.781, 0.712, 0.852) == pytest.approx(0.069 / 0.14)
    # Outside the band is allowed: below Full Reuse is negative, above Full Attention > 1.
    assert normalized_score(0.2, 0.4, 0.8) == pytest.approx(-0.5)
    assert normalized_score(1.0, 0.4, 0.8) == pytest.approx(1.5)
    # A baseline that beats Full Attention (x_FR > x_FA) still maps FR -> 0 and FA -> 1.
    assert normalized_score(0.6, 0.8, 0.4) == pytest.approx(0.5)


def test_normalized_score_degenerate_gap():
    assert normalized_score(0.3, 0.3, 0.3) == 1.0
    assert math.isnan(normalized_score(0.5, 0.3, 0.3))
    assert normalized_score(0.30005, 0.3, 0.3001, tol=1e-3) == 1.0
    assert math.isnan(normalized_score(0.4, 0.3, 0.3001, tol=1e-3))


def test_normalized_score_rejects_bad_numbers():
    with pytest.raises(ValueError, match="must be finite"):
        normalized_score(0.1, math.nan, 0.5)
    with pytest.raises(ValueError, match="tol >= 0"):
        normalized_score(0.1, 0.0, 0.5, tol=-1)


def test_docstring_examples_run():
    result = doctest.testmod(metrics)
    assert result.failed == 0 and result.attempted > 0


def test_parting_position_and_margins():
    assert metrics.parting_position([], []) is None and metrics.parting_position([], [3]) == 0
    assert metrics.parting_position(torch.tensor([1, 2]), [1, 3]) == 1
    margins = metrics.top_margins(torch.tensor([[1.0, 1.0], [0.0, math.log(3.0)]]))
    assert margins == pytest.approx([0.0, 0.5])  # probabilities 0.5/0.5 and 0.25/0.75
    assert metrics.choice_gap(torch.tensor([0.0, math.log(3.0)]), 0, 1) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match=r"\[n, vocab\] with vocab >= 2"):
        metrics.top_margins(torch.zeros(3))
