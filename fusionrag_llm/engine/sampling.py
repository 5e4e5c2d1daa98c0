"""How the next token is chosen from a sequence's logits: greedy by default, or sampled.

``SamplingParams`` is the per-request setting (validated at construction, the OpenAI / vLLM names and
ranges); ``next_tokens`` turns a step's logit rows into token ids. Penalties follow the usual
definitions: ``repetition_penalty`` (CTRL / transformers) divides positive and multiplies negative
logits of every token already in the prompt or the answer; ``frequency_penalty`` and
``presence_penalty`` (OpenAI) subtract ``count * frequency + (count > 0) * presence`` for tokens of the
answer. Then temperature, top-k, top-p (nucleus) and min-p filter what is sampled.

Each sampled sequence draws from its own ``torch.Generator``: with a ``seed`` the answer is the same
whatever else the engine batches with it; without one every call draws anew.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, fields
from numbers import Integral, Real
from typing import Any, Mapping, Sequence

import torch

from fusionrag_llm.engine.structured import check_json_schema
from fusionrag_llm.errors import FusionRAGError

MAX_STOP_TOKEN_IDS = 64
# Sampling runs in float32: a logit (tens at most) divided by a temperature below MIN_TEMPERATURE, or
# by a repetition penalty below MIN_PENALTY, can overflow to inf, and a top_p below MIN_TOP_P is
# rounded to zero. Values a float32 step computes are the allowed ones (vLLM and transformers
# accept smaller ones and fail, or treat them as greedy, at sampling time).
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-2, 1e4
MIN_TOP_P = 1e-6
MIN_PENALTY, MAX_PENALTY = 1e-2, 1e2


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise FusionRAGError(f"{name} must be a finite number, got {value!r:.40}")
    return float(value)


@dataclass(frozen=True)
class SamplingParams:
    """How to choose each new token; the defaults decode greedily.

    >>> SamplingParams().greedy, SamplingParams(temperature=0.7, seed=1).greedy
    (True, False)
    """

    temperature: float = 0.0  # 0: greedy (argmax); > 0 samples from softmax(logits / temperature)
    top_p: float = 1.0  # keep the smallest set of tokens whose probability reaches top_p; (0, 1]
    top_k: int = 0  # keep the k most likely tokens; 0 (or -1): all
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one; [0, 1]
    repetition_penalty: float = 1.0  # > 0; 1: off
    frequency_penalty: float = 0.0  # [-2, 2]
    presence_penalty: float = 0.0  # [-2, 2]
    seed: int | None = None  # None: a fresh draw each request
    stop_token_ids: tuple[int, ...] = ()  # token ids that end the answer besides the model's own
    ignore_eos: bool = False  # decode all max_new_tokens past the model's end tokens (timing a fixed length)
    # JSON output (``engine/structured.py``): None, True (any JSON object) or a JSON schema (dict or text)
    json_schema: Any = None

    def __post_init__(self) -> None:
        checks = {
            "temperature": (0.0, MAX_TEMPERATURE, f"0 (greedy) or a number in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE:g}]"),
            "top_p": (MIN_TOP_P, 1.0, f"a number in [{MIN_TOP_P}, 1]"),
            "min_p": (0.0, 1.0, "a number in [0, 1]"),
            "repetition_penalty": (MIN_PENALTY, MAX_PENALTY, f"a number in [{MIN_PENALTY}, {MAX_PENALTY:g}] (1 is off)"),
            "frequency_penalty": (-2.0, 2.0, "a number in [-2, 2]"),
            "presence_penalty": (-2.0, 2.0, "a number in [-2, 2]"),
        }
        for name, (low, high, allowed) in checks.items():
            value = _number(name, getattr(self, name))
            too_small = name == "temperature" and 0.0 < value < MIN_TEMPERATURE
            if value < low or value > high or too_small:
                raise FusionRAGError(f"{name} must be {allowed}, got {value!r}")
            object.__setattr__(self, name, value)
        top_k = self.top_k
        if isinstance(top_k, bool) or not isinstance(top_k, Integral) or top_k < -1:
            raise FusionRAGError(f"top_k must be an int >= 0 (0 or -1: no limit), got {top_k!r:.40}")
        object.__setattr__(self, "top_k", max(int(top_k), 0))
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= seed < 2**63):
            raise FusionRAGError(f"seed must be None or an int in [0, 2**63), got {seed!r:.40}")
        if not isinstance(self.ignore_eos, bool):
            raise FusionRAGError(f"ignore_eos must be True or False, got {self.ignore_eos!r:.40}")
        stop = self.stop_token_ids
        if isinstance(stop, (str, bytes, Mapping)) or not hasattr(stop, "__iter__"):
            raise FusionRAGError(f"stop_token_ids must be a list of token ids, got {type(stop).__name__}")
        stop = tuple(stop)
        if len(stop) > MAX_STOP_TOKEN_IDS or not all(isinstance(t, Integral) and not isinstance(t, bool) and t >= 0
                                                     for t in stop):  # fmt: skip
            raise FusionRAGError(f"stop_token_ids must hold at most {MAX_STOP_TOKEN_IDS} ints >= 0, got {stop!r:.80}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in stop))
        object.__setattr__(self, "json_schema", check_json_schema(self.json_schema))

    @classmethod
    def of(cls, value: "SamplingParams | Mapping[str, Any] | None") -> "SamplingParams":
        """``value`` as ``SamplingParams``: itself, a dict of its fields, or None (greedy)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(SAMPLING_FIELDS))
            if unknown:
                raise FusionRAGError(f"unknown sampling option(s) {unknown}; allowed: {', '.join(SAMPLING_FIELDS)}")
            return cls(**value)
        raise FusionRAGError(f"sampling must be a SamplingParams, a dict of its fields or None, got {type(value).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def plain_greedy(self) -> bool:
        """The argmax of the raw logits: nothing here changes what greedy decoding picks."""
        return self.greedy and not self.penalised and self.json_schema is None

    def generator(self, device: torch.device | str, offset: int = 0) -> torch.Generator | None:
        """A sequence's own random stream (None when greedy: nothing is drawn); ``offset`` tells the
        answers of one request apart (answer i of a seeded request draws from ``seed + i``)."""
        if self.greedy:
            return None
        seed = (self.seed + offset) % 2**63 if self.seed is not None else secrets.randbits(63)
        return torch.Generator(device=device).manual_seed(seed)


SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))
GREEDY = SamplingParams()


@dataclass
class SamplingState:
    """One sequence's draw: its settings, its random stream and the ids its penalties look at."""

    params: SamplingParams
    generator: torch.Generator | None
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    constraint: Any = None  # its JSONConstraint when it asked for JSON


def next_tokens(logits: torch.Tensor, states: Sequence[SamplingState]) -> list[int | Exception]:
    """One token per row of ``logits`` ([n, vocab]), each by its own state; one read-back when all
    rows are plain greedy. A row whose draw fails (non-finite logits, say) gets its exception in its
    place: that sequence fails alone."""
    if all(state.params.plain_greedy for state in states):
        return logits.argmax(dim=-1).tolist()
    return [_guarded(row, state) for row, state in zip(logits, states)]


def _guarded(row: torch.Tensor, state: SamplingState) -> int | Exception:
    try:
        return _one_token(row, state)
    except Exception as exc:  # one request's draw fails alone
        return exc


def _one_token(row: torch.Tensor, state: SamplingState) -> int:
    params = state.params
    row = row.float()
    if state.constraint is not None:
        row = state.constraint.restrict(row)
    if params.penalised:
        row = penalise(row, state.prompt_ids, state.output_ids, params)
    if params.greedy:
        token = int(row.argmax())
    else:
        token = int(torch.multinomial(filtered_probs(row, params), 1, generator=state.generator))
    if state.constraint is not None:
        state.constraint.accept(token)
    return token


def penalise(row: torch.Tensor, prompt_ids: Sequence[int], output_ids: Sequence[int],
             params: SamplingParams) -> torch.Tensor:  # fmt: skip
    """``row`` ([vocab] logits) with the repetition, frequency and presence penalties applied."""
    row = row.clone()
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.long, device=row.device)
        if len(seen):
            picked = row[seen]
            penalty = params.repetition_penalty
            row[seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
    if output_ids and (params.frequency_penalty or params.presence_penalty):
        ids = torch.tensor(list(output_ids), dtype=torch.long, device=row.device)
        counts = torch.bincount(ids, minlength=row.numel())[: row.numel()].to(row.dtype)
        row -= counts * params.frequency_penalty + (counts > 0).to(row.dtype) * params.presence_penalty
    return row


def filtered_probs(row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[vocab] probabilities after temperature, top-k, top-p and min-p (renormalised)."""
    probs = torch.softmax(row / params.temperature, dim=-1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if params.top_k and params.top_k < probs.numel():
        keep &= probs >= torch.topk(probs, params.top_k).values[-1]
    if params.top_p < 1.0:
        ordered, order = probs.sort(descending=True)
        before = ordered.cumsum(0) - ordered  # probability of the tokens ranked above each one
        nucleus = torch.zeros_like(keep)
        nucleus[order] = before < params.top_p
        nucleus[order[0]] = True  # the most likely token always stays
        keep &= nucleus
    if params.min_p > 0.0:
        keep &= probs >= params.min_p * probs.max()
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum()
