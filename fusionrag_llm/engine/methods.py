"""The method registry: every method the engine runs is one ``MethodSpec`` row, checked by one validator.

A method is where its chunk KV comes from (``kv_variant``), how it picks the reused tokens to
recompute (``selector``, a row of ``fusion.selectors.SELECTORS``) and the extra stages it needs,
all as data. ``check_run_options`` is the only place that validates a run's knobs; the facade, the
engine, the framework adapters, the CLI and the benchmarks all go through it (or through
``plan_run``, its positional form) and list names from ``METHODS`` / ``SELECTORS`` / ``KV_VARIANTS``.

Adding a method:

1. its selection rule, if new: one module ``fusion/scorers/<name>.py`` with
   ``scores(inp: ScoringInput) -> Tensor`` and its ``SelectorSpec`` row in ``fusion/selectors.py``;
2. one ``MethodSpec`` row in ``METHODS`` below, with the stages it needs switched on.

A row that needs a stage the engine does not run yet (``MethodSpec.stages``) is listed but refused
by the validator with a message naming the stage, so a method can be described before it runs.

    >>> plan = check_run_options(method="cacheblend", recompute_ratio=0.15)
    >>> plan.kv_variant, plan.selector, plan.recompute_ratio
    ('plain', 'kv_deviation', 0.15)
    >>> check_run_options(method="full_reuse", recompute_ratio=0.5).recompute_ratio  # selects nothing
    0.0
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.selectors import SELECTORS, selector_spec
from fusionrag_llm.models.kv_eviction import DecodeEviction, decode_eviction

KV_VARIANTS = ("plain", "fused")
# Which of a chunk's stored variants serves it in a given request (see ``engine/resolve.py``):
# "always": its fused entry whenever stored (the paper); "overlap": its fused entry only when at
# least VARIANT_MIN_OVERLAP of the chunks it was fused after are in this request, else its plain one;
# "check": whichever of the two has KV closer to this prompt's exact KV at layer VARIANT_CHECK_LAYER
# (layers below it are run once over the context to know it: about 1/num_layers of a full prefill);
# "probe": every VARIANT_PROBE_STRIDE-th chunk token runs through all layers over the fused context; a
# chunk switches to plain when, at the upper half of the layers, that probe is closer to the plain entry
# than VARIANT_PROBE_MARGIN times its distance to the fused one (``engine/variant_choice.py``);
# "cfo": Cache-Craft's choice, the variant with the lower Cache Fix Overhead given the chunks in front
# of it in this request (``fusion/craft.py``); "cfo_exact": the same, but a variant made by an earlier
# request (``craft_variants``) serves only after exactly the chunks it was made after; "blend": each
# chunk's K/V is VARIANT_BLEND times its fused entry's plus the rest times its plain entry's (neither
# context is this prompt's: the one lacks the chunks before it, the other has neighbours that may not be
# in the prompt). Under "check", "probe" and "blend" a chunk whose neighbours are all ahead of it in the
# order they were placed keeps its fused entry alone (``fusion/fused_order.context_in_place``).
VARIANT_POLICIES = ("always", "overlap", "check", "probe", "cfo", "cfo_exact", "blend")
CFO_POLICIES = ("cfo", "cfo_exact")
BOTH_ENTRY_POLICIES = ("check", "probe", "blend")  # read a fused chunk's plain entry too
VARIANT_MIN_OVERLAP = 0.5
VARIANT_CHECK_LAYER = 1
VARIANT_PROBE_STRIDE = 16
VARIANT_PROBE_MARGIN = 1.5
VARIANT_BLEND = 0.5
# ``kv_shift``: at every layer from the upper half up, the tokens a chunk keeps reused move by this share
# of the mean K/V change of its recomputed tokens (``fusion/kv_shift.py``); 0 turns it off.
KV_SHIFT = 0.5
# Stages beyond resolve -> select -> sparse prefill -> decode that this engine runs today.
# Chunk boundaries: every selector gets each chunk's span in the request layout. Auxiliary model:
# the first layers of the main model (``FusionRAG(auxiliary=...)``), run by the selector. Parallel
# positions: every chunk starts right after the prefix. Attention scaling: computed tokens see the
# chunk tokens as one group, sharpened by APE_TEMPERATURE inside and weighted by APE_SCALE as a whole.
# Offline metadata: Cache-Craft's notes on every fused entry, measured when it is computed. Early stop:
# the sparse prefill drops rows part way (Cache-Craft's focused chunks, ``fusion/craft.FocusTracker``).
ENGINE_STAGES: frozenset[str] = frozenset({"needs_chunk_boundaries", "auxiliary_model", "parallel_positions",
                                           "attention_scaling", "offline_metadata", "early_stop"})  # fmt: skip
# APE's defaults as its comparisons report them (temperature 0.9, scaling factor 0.9).
APE_TEMPERATURE = 0.9
APE_SCALE = 0.9


def _check_fraction(knob: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise FusionRAGError(f"{knob} must be a number in [0, 1], got {value!r}")


@dataclass(frozen=True)
class MethodSpec:
    """One method as data; every stage flag is off for a method the plain pipeline runs."""

    name: str
    kv_variant: str | None  # None: no chunk reuse at all (full attention)
    selector: str  # a key of SELECTORS
    description: str = ""
    # selection from stored data before any forward pass (e.g. EPIC's first tokens of each chunk)
    select_before_prefill: bool = False
    # a recompute set that changes from layer to layer (e.g. CacheBlend's gradual filtering)
    per_layer_selection: bool = False
    # a temperature / scale on attention over reused chunks (e.g. APE)
    attention_scaling: bool = False
    # every chunk at the positions right after the prefix, as if encoded alone (e.g. APE)
    parallel_positions: bool = False
    # the selector needs each chunk's token span (e.g. EPIC, CacheClip's 8-token groups)
    needs_chunk_boundaries: bool = False
    # names of per-chunk data the offline stage must store (e.g. Cache-Craft's "cci")
    offline_metadata: tuple[str, ...] = ()
    # a second, smaller model the selector runs (e.g. CacheClip); None: none
    auxiliary_model: str | None = None
    # the sparse prefill stops recomputing the tokens of chunks the question does not focus on once
    # that set is stable (Cache-Craft's adaptive early termination)
    early_stop: bool = False
    # the method's own variant policy (one of VARIANT_POLICIES) when it reuses fused entries
    variant_policy: str = "always"
    # the method's own share of the recomputed tokens' K/V change given to the rest of their chunk
    kv_shift: float = 0.0

    def __post_init__(self) -> None:
        if self.variant_policy not in VARIANT_POLICIES:
            raise FusionRAGError(f"method {self.name!r}: variant_policy {self.variant_policy!r} is not one of {VARIANT_POLICIES}")
        _check_fraction(f"method {self.name!r}: kv_shift", self.kv_shift)
        if self.kv_variant is not None and self.kv_variant not in KV_VARIANTS:
            raise FusionRAGError(f"method {self.name!r}: kv_variant {self.kv_variant!r} is not one of {KV_VARIANTS}")
        if selector_spec(self.selector).selects and self.kv_variant is None:
            raise FusionRAGError(f"method {self.name!r} reuses no chunk KV, so its selector must be 'none'")

    @property
    def stages(self) -> tuple[str, ...]:
        """The names of the extra stages this method needs (empty for the plain pipeline)."""
        defaults = {f.name: f.default for f in fields(self)}
        flags = ("select_before_prefill", "per_layer_selection", "attention_scaling", "parallel_positions",
                 "needs_chunk_boundaries", "offline_metadata", "auxiliary_model", "early_stop")  # fmt: skip
        return tuple(name for name in flags if getattr(self, name) != defaults[name])


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec("full_attention", None, "none", "exact prefill of the whole prompt (the baseline)"),
        MethodSpec("full_reuse", "plain", "none", "reuse every chunk's plain KV, positions corrected (TurboRAG)"),
        MethodSpec("cacheblend", "plain", "kv_deviation", "plain KV, recompute the tokens whose layer-1 KV drifts most"),
        MethodSpec("fusionrag", "fused", "query_guided_layers",
                   "each chunk's fused and plain KV blended, recompute the tokens the question attends to most over "
                   "the upper layers; the rest of each chunk moved by half its recomputed tokens' mean K/V change",
                   variant_policy="blend", kv_shift=KV_SHIFT),
        MethodSpec("fusionrag_paper", "fused", "query_guided",
                   "fused KV, recompute the tokens the question attends to most at the last layer (the paper)"),
        MethodSpec("a3", "plain", "early_attention", "plain KV; layer 0 for all tokens, then the tokens the question attends to most at layer 1 (A3)"),
        MethodSpec("epic", "plain", "chunk_starts", "plain KV, recompute the first tokens of every chunk (EPIC's LegoLink)",
                   needs_chunk_boundaries=True),
        MethodSpec("cacheclip", "plain", "auxiliary_attention",
                   "plain KV, recompute the tokens a shallower model's question attention picks, in 8-token windows (CacheClip)",
                   needs_chunk_boundaries=True, auxiliary_model="first_layers"),
        MethodSpec("cache_craft", "fused", "cache_craft",
                   "the variant (fused or plain) with the lowest Cache Fix Overhead, its most contextualised tokens "
                   "recomputed per chunk, unfocused chunks stopped early (Cache-Craft)",
                   needs_chunk_boundaries=True, offline_metadata=("cci", "inter", "order"), early_stop=True,
                   variant_policy="cfo"),
        MethodSpec("ape", "plain", "none",
                   "plain KV, every chunk at the positions right after the prefix, attention to chunks sharpened and scaled (APE)",
                   attention_scaling=True, parallel_positions=True),
    )
}  # fmt: skip


@dataclass(frozen=True)
class RunPlan:
    """What one request runs: where chunk KV comes from, how tokens are selected, how many."""

    method: str
    kv_variant: str | None
    selector: str
    recompute_ratio: float
    seed: int = 0
    variant_policy: str = "always"
    # A3's decode KV eviction (``models/kv_eviction.py``) after the prefill; None: the cache is kept whole
    decode_eviction: DecodeEviction | None = None
    # the share of each chunk's recomputed tokens' K/V change its reused tokens take (``fusion/kv_shift.py``)
    kv_shift: float = 0.0

    @property
    def reuses_chunks(self) -> bool:
        return self.kv_variant is not None

    @property
    def parallel_positions(self) -> bool:
        """Every chunk starts right after the prefix (the method's own layout)."""
        return METHODS[self.method].parallel_positions

    @property
    def attention_scaling(self) -> tuple[float, float] | None:
        """(temperature, scale) of computed tokens' attention to chunk tokens; None: plain attention."""
        return (APE_TEMPERATURE, APE_SCALE) if METHODS[self.method].attention_scaling else None

    @property
    def early_stop(self) -> bool:
        """The sparse prefill may stop recomputing unfocused chunks part way (Cache-Craft)."""
        return METHODS[self.method].early_stop and self.kv_variant is not None

    @property
    def reads_variant_spread(self) -> bool:
        """The selector weighs blended tokens by how far their fused and plain entries lie apart."""
        return self.variant_policy == "blend" and SELECTORS[self.selector].reads_variant_spread

    @property
    def ratio_free(self) -> bool:
        """True when the ratio cannot change the run: no chunk reuse, or a selector that picks nothing."""
        return not self.reuses_chunks or not SELECTORS[self.selector].selects


def check_run_options(*, method: str, recompute_ratio: float, kv_variant: str | None = None,
                      selector: str | None = None, seed: int = 0, variant_policy: str | None = None,
                      decode_kv_budget: int | DecodeEviction | None = None, kv_shift: float | None = None) -> RunPlan:  # fmt: skip
    """Validate a run's knobs; ``kv_variant``/``selector`` override the method's own (ablations);
    ``variant_policy`` (fused entries only) is one of ``VARIANT_POLICIES``, default the method's own;
    ``decode_kv_budget`` (default None: off) turns on A3's decode KV eviction: an int is the chunk
    tokens every layer and kv-head keeps after the prefill, a ``DecodeEviction`` sets all its knobs;
    ``kv_shift`` (a share in [0, 1], default the method's own, 0 = off) moves each chunk's reused
    tokens by that share of its recomputed tokens' K/V change (``fusion/kv_shift.py``).

    >>> check_run_options(method="a3", recompute_ratio=0.15, decode_kv_budget=128).decode_eviction.budget
    128

    Raises ``FusionRAGError`` (a ``ValueError``) naming the bad knob and what is allowed.
    """
    spec = _method(method)
    _check_choice("kv_variant", kv_variant, KV_VARIANTS)
    _check_choice("variant_policy", variant_policy, VARIANT_POLICIES)
    if selector is not None:
        selector_spec(selector)
    _check_fraction("recompute_ratio", recompute_ratio)
    _check_seed(seed)
    if kv_shift is not None:  # None: the method's own
        _check_fraction("kv_shift", kv_shift)
    _check_stages(spec)
    eviction = decode_eviction(decode_kv_budget)
    if eviction is not None and spec.attention_scaling:
        allowed = ", ".join(name for name, row in METHODS.items() if not row.attention_scaling)
        raise FusionRAGError(f"decode_kv_budget does not apply to {method} (its attention scaling marks slots shared "
                             f"by every head); methods that take it: {allowed}")  # fmt: skip
    if spec.kv_variant is None:
        if kv_variant is not None or selector not in (None, "none"):
            raise FusionRAGError(f"{method} reuses no chunk KV; kv_variant and selector do not apply to it")
        return RunPlan(method, None, "none", 1.0, seed, decode_eviction=eviction)
    if spec.parallel_positions and selector not in (None, spec.selector):
        raise FusionRAGError(f"{method} recomputes no chunk token (its chunks share positions); selector does not apply to it")
    chosen, variant = selector or spec.selector, kv_variant or spec.kv_variant
    if variant_policy not in (None, "always") and variant != "fused":
        raise FusionRAGError(f"variant_policy {variant_policy!r} chooses between fused and plain entries; "
                             f"it needs kv_variant 'fused', and this run reuses {variant!r} entries")  # fmt: skip
    ratio = float(recompute_ratio) if SELECTORS[chosen].selects else 0.0
    policy = variant_policy or (spec.variant_policy if variant == "fused" else "always")
    if SELECTORS[chosen].reads_variant_spread and policy != "blend":
        raise FusionRAGError(f"selector {chosen!r} reads how far each chunk's fused and plain entries lie apart, "
                             f"which only variant_policy 'blend' measures; this run's policy is {policy!r}")  # fmt: skip
    shifts = not (spec.early_stop or policy in CFO_POLICIES)  # else the method's own share is off
    shift = (spec.kv_shift if shifts else 0.0) if kv_shift is None else float(kv_shift)
    if shift and not shifts:
        raise FusionRAGError(f"kv_shift does not apply to {method} with variant_policy {policy!r} (its prefill stops "
                             f"recomputing tokens part way, or keeps the request's KV as chunk variants); use kv_shift=0")  # fmt: skip
    return RunPlan(method, variant, chosen, ratio, seed, policy, eviction, shift if SELECTORS[chosen].selects else 0.0)


def plan_run(method: str, recompute_ratio: float, kv_variant: str | None = None,
             selector: str | None = None, seed: int = 0, variant_policy: str | None = None,
             decode_kv_budget: int | DecodeEviction | None = None, kv_shift: float | None = None) -> RunPlan:  # fmt: skip
    """Positional form of :func:`check_run_options` (the facade's call sites)."""
    return check_run_options(method=method, recompute_ratio=recompute_ratio, kv_variant=kv_variant,
                             selector=selector, seed=seed, variant_policy=variant_policy,
                             decode_kv_budget=decode_kv_budget, kv_shift=kv_shift)  # fmt: skip


def _method(name: str) -> MethodSpec:
    spec = METHODS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise FusionRAGError(f"unknown method {name!r}; valid methods: {', '.join(METHODS)}")
    return spec


def _check_choice(knob: str, value: str | None, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise FusionRAGError(f"unknown {knob} {value!r}; valid: {', '.join(allowed)}")


def _check_seed(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FusionRAGError(f"seed must be an int >= 0, got {value!r}")


def _check_stages(spec: MethodSpec) -> None:
    missing = [stage for stage in spec.stages if stage not in ENGINE_STAGES]
    if missing:
        raise FusionRAGError(f"method {spec.name!r} needs stage(s) {', '.join(missing)}, which this engine does not run yet")


__all__ = ["APE_SCALE", "BOTH_ENTRY_POLICIES", "DecodeEviction", "APE_TEMPERATURE", "ENGINE_STAGES", "KV_VARIANTS", "VARIANT_BLEND", "VARIANT_CHECK_LAYER", "VARIANT_MIN_OVERLAP", "VARIANT_PROBE_MARGIN", "VARIANT_PROBE_STRIDE", "VARIANT_POLICIES", "METHODS", "MethodSpec", "RunPlan", "SELECTORS", "check_run_options", "plan_run"]
