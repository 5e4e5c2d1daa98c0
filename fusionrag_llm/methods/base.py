"""The method protocol: what a way of answering over chunk KV tells the engine.

A method is a ``Method`` subclass (a frozen dataclass whose fields are its options) in one module,
registered by name (``fusionrag_llm.methods.register_method``). The engine asks it four things:

* **which stored variant serves each chunk** (``chunk_kv``): ``None`` (no reuse: every token is
  computed), ``"plain"``, ``"fused"``, ``"blend"`` (the mean of a chunk's fused and plain KV) or
  ``"cfo"`` (Cache-Craft's choice among a chunk's variants by Cache Fix Overhead); and whether chunks
  share positions or see rescaled attention (``parallel_positions``, ``attention_scaling``);
* **which tokens to recompute** given the budget ``k = round(r x reused tokens)``: ``scores`` gives
  one score per reused token (higher = recompute first) and ``pick`` turns scores into slots (default:
  the ``k`` highest). A scorer that is one forward pass also gives its halves (``scoring_pass``,
  ``scores_from``) so the engine batches it with other requests'. A method without ``scores``
  recomputes nothing, whatever the ratio;
* **its per-request work** (``start``): a ``MethodRun`` holding the typed layer hooks of the sparse
  prefill (``LayerHook``: early stop, KV shift, attention statistics), the rescaled attention every
  step of the request takes (``AttentionScaling``), and the work after the prefill (write-back, decode
  KV eviction), with the request's state and stats (``stats.method_stats``);
* **its default ratio** (``default_ratio``).

    >>> from fusionrag_llm.methods import get_method
    >>> method = get_method("cacheblend")
    >>> method.chunk_kv, method.default_ratio, method.selects
    ('plain', 0.15, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.layout import RequestLayout, ScoringInput
from fusionrag_llm.models.forward import AttentionScaling, LayerHook
from fusionrag_llm.models.kv_cache import KVCache

CHUNK_KV = (None, "plain", "fused", "blend", "cfo")


@dataclass
class Prefill:
    """One request's sparse prefill, as a method's ``start`` sees it."""

    model: Any  # the DecoderLM
    layout: RequestLayout
    cache: KVCache  # the request's cache, chunk KV in place
    recompute: torch.Tensor  # sorted slots the prefill runs (selected chunk tokens and fresh text)
    selected: torch.Tensor  # the reused slots the method chose
    exact: bool  # every context token's KV is exact after this prefill (nothing left reused)
    stats: dict  # the request's ``stats.method_stats``
    resolver: Any = None  # the request's context resolver (``store_request_variants`` for write-back)
    resolved: Any = None  # what it assembled


class MethodRun:
    """A method's state for one request: the prefill's layer hooks, the attention its prefill and decode
    steps take, and the work after the prefill."""

    hooks: tuple[LayerHook, ...] = ()
    scaling: AttentionScaling | None = None  # rescaled attention for every step of the request (APE)

    def after_prefill(self, prefill: Prefill) -> KVCache | None:
        """Runs once the first token's logits are known; may return a new cache for decoding."""
        return None


@dataclass(frozen=True)
class Method:
    """One method; subclasses set the class attributes and override what they change."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    default_ratio: ClassVar[float] = 0.15
    chunk_kv: ClassVar[str | None] = "plain"
    parallel_positions: ClassVar[bool] = False  # every chunk at the positions right after the prefix
    attention_scaling: ClassVar[tuple[float, float] | None] = None  # (temperature, scale) on chunk attention
    offline_notes: ClassVar[bool] = False  # reads Cache-Craft's notes on fused entries (``add_chunks``)

    # ------------------------------------------------------------------ selection
    scores = None  # (self, ScoringInput) -> [len(layout.reused_slots)] scores; None: selects nothing
    scoring_pass = None  # (self, ScoringInput) -> ForwardPass: the scorer's forward, batched by the engine ...
    scores_from = None  # (self, ScoringInput, ForwardOutput) -> scores: ... and its reading
    reads_cache = False  # ``scores`` reads the placed KV outside a forward (waits for layer-wise loading)

    @property
    def selects(self) -> bool:
        return self.chunk_kv is not None and type(self).scores is not None

    def pick(self, layout: RequestLayout, scores: torch.Tensor, k: int) -> torch.Tensor:
        """The slots ``scores`` choose (at most ``k``), ascending."""
        reused = layout.reused_slots
        return reused[torch.topk(scores, k).indices].sort().values

    # ------------------------------------------------------------------ per request
    def start(self, prefill: Prefill) -> MethodRun:
        """This request's hooks and after-prefill work (default: none)."""
        return MethodRun()

    def check_ratio(self, recompute_ratio: float | None) -> float:
        """The ratio a run uses: the method's own when None; 0 for a method that selects nothing
        (1 without chunk reuse); else a number in [0, 1]."""
        if recompute_ratio is not None:
            check_fraction("recompute_ratio", recompute_ratio)
        if self.chunk_kv is None:
            return 1.0
        if not self.selects:
            return 0.0
        return float(self.default_ratio if recompute_ratio is None else recompute_ratio)


@dataclass(frozen=True)
class RunPlan:
    """What one request runs: a method and its recompute ratio (checked by ``make_plan``), and whether
    its answer may depend on exact KV earlier requests left (``reproducible``: None, the engine's
    setting; True: it reads only the stored chunk entries and the prompt prefix's KV, never path
    blocks, turn KV or Cache-Craft variants other requests made)."""

    method: Method
    recompute_ratio: float
    reproducible: bool | None = None

    @property
    def name(self) -> str:
        return self.method.name

    @property
    def reuses_chunks(self) -> bool:
        return self.method.chunk_kv is not None

    @property
    def exact(self) -> bool:
        """Every token's KV is exact: no chunk reuse, or every reused token recomputed."""
        return not self.reuses_chunks or (self.recompute_ratio >= 1.0 and self.method.selects)


def check_fraction(knob: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise FusionRAGError(f"{knob} must be a number in [0, 1], got {value!r}")


def select_many(jobs: list[tuple[Method, int, ScoringInput]], model) -> list[torch.Tensor | Exception]:
    """Each job's ``k`` reused slots to recompute, ascending. Scorers that are one forward pass run as
    one batched forward (``model.forward_batch``), the others one by one; a job that fails gets its
    exception in its place (a failed batched forward fails every job in it)."""
    results: list[torch.Tensor | Exception | None] = [None] * len(jobs)
    batched = []
    for i, (method, k, inp) in enumerate(jobs):
        try:
            reused = inp.layout.reused_slots
            if k <= 0 or not method.selects:
                results[i] = reused[:0]
            elif k >= len(reused):
                results[i] = reused
            elif method.scoring_pass is None:
                if method.reads_cache:
                    inp.cache.settle()  # reads the placed KV itself: every layer must be in
                results[i] = method.pick(inp.layout, method.scores(inp), k)
            else:
                batched.append(i)
        except Exception as exc:  # one bad sequence fails alone
            results[i] = exc
    if batched:
        try:
            passes = [jobs[i][0].scoring_pass(jobs[i][2]) for i in batched]
            outputs = model.forward_batch(passes, [jobs[i][2].cache for i in batched])
            for i, out in zip(batched, outputs):
                method, k, inp = jobs[i]
                results[i] = method.pick(inp.layout, method.scores_from(inp, out), k)
        except Exception as exc:
            for i in batched:
                results[i] = exc
    return results


__all__ = ["CHUNK_KV", "AttentionScaling", "LayerHook", "Method", "MethodRun", "Prefill", "RunPlan",
           "ScoringInput", "check_fraction", "select_many"]
