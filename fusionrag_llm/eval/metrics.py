"""Quality and fidelity metrics: SQuAD answer scores, KL to Full Attention, normalised score.

Task quality compares a generated answer with gold answers (SQuAD normalisation, EM and
token-level F1). Fidelity compares a method with Full Attention on the same model: KL divergence
of next-token distributions over the teacher-forced reference answer, first-token agreement and
greedy-answer exact match. ``normalized_score`` places a method between Full Reuse (0) and Full
Attention (1), as in eq. 11 of the FusionRAG paper (without the x100 percentage factor).

Example:
    >>> exact_match("The Eiffel Tower!", ["eiffel tower"])
    1.0
    >>> round(normalized_score(0.781, x_full_reuse=0.712, x_full_attention=0.852), 3)
    0.493
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Sequence

import torch

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lowercase, strip ASCII punctuation, drop articles, collapse whitespace (SQuAD rules).

    Example:
        >>> normalize_answer("  The  Cat's   hat. ")
        'cats hat'
    """
    if not isinstance(s, str):
        raise ValueError(f"answer must be a str, got {type(s).__name__}")
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _gold_list(golds: str | Sequence[str]) -> list[str]:
    golds = [golds] if isinstance(golds, str) else list(golds)  # a bare string is one answer, not its characters
    if not golds or not all(isinstance(gold, str) for gold in golds):
        raise ValueError(f"golds must be a str or a non-empty sequence of str, got {golds!r}")
    return golds


def exact_match(prediction: str, golds: str | Sequence[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer, else 0.0.

    Example:
        >>> exact_match("an apple", ["Apple", "pear"])
        1.0
    """
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _gold_list(golds)))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        # SQuAD 2.0 convention: two empty answers agree, one empty answer scores 0.
        return float(pred_tokens == gold_tokens)
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: str | Sequence[str]) -> float:
    """Token-level F1 of the normalised answers, maximised over the gold answers.

    Example:
        >>> round(f1_score("the cat sat on the mat", ["a cat sat"]), 4)
        0.6667
    """
    pred_tokens = normalize_answer(prediction).split()
    return max(_token_f1(pred_tokens, normalize_answer(g).split()) for g in _gold_list(golds))


def kl_divergence(reference_logits: torch.Tensor, method_logits: torch.Tensor) -> torch.Tensor:
    """Per-position KL(P_ref || P_method) from logits, in float64; shape ``[..., vocab] -> [...]``.

    Tokens with zero reference probability contribute 0; a token the reference allows but the method
    forbids (``-inf`` logit) gives ``inf``. Tiny negative round-off is clamped to 0.

    Example:
        >>> ref = torch.tensor([[0.0, 0.0]])
        >>> kl_divergence(ref, ref).tolist()
        [0.0]
    """
    if reference_logits.shape != method_logits.shape or not reference_logits.shape or not reference_logits.shape[-1]:
        raise ValueError("reference_logits and method_logits must have the same shape with a non-empty last (vocab) "
                         f"dim, got {tuple(reference_logits.shape)} and {tuple(method_logits.shape)}")  # fmt: skip
    ref_logp = torch.log_softmax(reference_logits.double(), dim=-1)
    method_logp = torch.log_softmax(method_logits.to(device=ref_logp.device, dtype=torch.float64), dim=-1)
    ref_p = ref_logp.exp()
    terms = torch.where(ref_p > 0, ref_p * (ref_logp - method_logp), torch.zeros_like(ref_p))
    return terms.sum(dim=-1).clamp_min(0.0)


def mean_kl(reference_logits: torch.Tensor, method_logits: torch.Tensor) -> float:
    """Mean of :func:`kl_divergence` over all positions, as a Python float.

    Example:
        >>> mean_kl(torch.zeros(3, 5), torch.zeros(3, 5))
        0.0
    """
    per_position = kl_divergence(reference_logits, method_logits)
    if per_position.numel() == 0:
        raise ValueError("mean_kl needs at least one position; got 0 positions")
    return float(per_position.mean())


def _as_ids(ids: Sequence[int] | torch.Tensor) -> list[int]:
    return ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)


def first_token_agreement(
    ref_ids: Sequence[int] | torch.Tensor, ids: Sequence[int] | torch.Tensor
) -> float:
    """1.0 when both generations start with the same token, else 0.0.

    Two empty generations agree (1.0); an empty one never agrees with a non-empty one (0.0).

    Example:
        >>> first_token_agreement([5, 7, 9], [5, 8])
        1.0
    """
    return float(_as_ids(ref_ids)[:1] == _as_ids(ids)[:1])


def greedy_exact_match(
    ref_ids: Sequence[int] | torch.Tensor, ids: Sequence[int] | torch.Tensor
) -> float:
    """1.0 when the two greedy generations are the same token sequence, else 0.0.

    Example:
        >>> greedy_exact_match([5, 7], [5, 7]), greedy_exact_match([5, 7], [5, 7, 2])
        (1.0, 0.0)
    """
    return float(_as_ids(ref_ids) == _as_ids(ids))


def parting_position(ref_ids: Sequence[int] | torch.Tensor, ids: Sequence[int] | torch.Tensor) -> int | None:
    """The first position at which two generations differ (one may end there); None when equal.

    Example:
        >>> parting_position([5, 7, 9], [5, 8, 9]), parting_position([5, 7], [5, 7, 2]), parting_position([5], [5])
        (1, 2, None)
    """
    ref, got = _as_ids(ref_ids), _as_ids(ids)
    if ref == got:
        return None
    return next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))


def top_margins(logits: torch.Tensor) -> list[float]:
    """Per row of ``[n, vocab]`` logits, the top-1 minus the top-2 probability: how far the greedy
    choice was from a tie (0: a tie; near 1: no contest).

    Example:
        >>> [round(m, 3) for m in top_margins(torch.tensor([[0.0, 0.0, -50.0], [5.0, 0.0, 0.0]]))]
        [0.0, 0.98]
    """
    if logits.dim() != 2 or logits.shape[-1] < 2:
        raise ValueError(f"logits must be [n, vocab] with vocab >= 2, got shape {tuple(logits.shape)}")
    top = torch.softmax(logits.double(), dim=-1).topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def choice_gap(logits_row: torch.Tensor, chosen: int, other: int) -> float:
    """The probability of ``chosen`` minus that of ``other`` under one row of logits ``[vocab]``.

    Example:
        >>> round(choice_gap(torch.tensor([2.0, 0.0, 0.0]), 0, 1), 3)
        0.68
    """
    probs = torch.softmax(logits_row.double(), dim=-1)
    return float(probs[chosen] - probs[other])


def normalized_score(
    x: float, x_full_reuse: float, x_full_attention: float, tol: float = 0.0
) -> float:
    """``(x - x_FR) / (x_FA - x_FR)``: 0 at Full Reuse, 1 at Full Attention (paper eq. 11).

    Degenerate case ``|x_FA - x_FR| <= tol`` (no gap to close): returns 1.0 when
    ``|x - x_FA| <= tol`` (the method matches both baselines, nothing was lost) and ``nan``
    otherwise (the ratio is undefined). Callers averaging scores should skip the nans
    (``math.isnan``) and report how many there were. Multiply by 100 for the paper's percent.

    Example:
        >>> normalized_score(0.5, 0.0, 1.0), normalized_score(0.3, 0.3, 0.3)
        (0.5, 1.0)
    """
    if not all(math.isfinite(value) for value in (x, x_full_reuse, x_full_attention)) or not tol >= 0:
        raise ValueError(f"scores must be finite and tol >= 0, got {x!r}, {x_full_reuse!r}, {x_full_attention!r}, {tol!r}")
    gap = x_full_attention - x_full_reuse
    if abs(gap) <= tol:
        return 1.0 if abs(x - x_full_attention) <= tol else math.nan
    return float((x - x_full_reuse) / gap)
