"""Benchmark method specs and option parsing (plain Python, no tensors).

A benchmark method is an engine method (``full_attention``, ``full_reuse``, ``cacheblend``,
``fusionrag``, ``fusionrag_paper``, ...) or an ablation written ``<kv_variant>+<selector>`` (e.g.
``fused+kv_deviation``, ``plain+query_guided``): the paper's method (``fusionrag_paper``, whose
variant policy is ``"always"``) with its KV variant and selector overridden.
Either may end in ``:<variant_policy>`` (e.g. ``fusionrag:overlap``) to choose between a chunk's
fused and plain entries per request (``VARIANT_POLICIES``), then in ``~<share>`` (e.g. ``fusionrag~0``)
to set ``kv_shift`` (the share of a chunk's recomputed tokens' K/V change its reused tokens take; 0 =
off), and in ``@<budget>`` (e.g. ``a3@64``) to evict decode KV down to that many chunk tokens per
layer and kv-head (``decode_kv_budget``).

Example:
    >>> [m.label for m in parse_methods("cacheblend,fused+kv_deviation")]
    ['full_attention', 'full_reuse', 'cacheblend', 'fused+kv_deviation']
    >>> parse_method("a3@64").decode_kv_budget
    64
    >>> parse_method("fusionrag~0").kv_shift
    0.0
    >>> parse_ratios("0.15,0,1")
    (0.0, 0.15, 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass

from fusionrag_llm.engine.methods import CFO_POLICIES, KV_VARIANTS, METHODS, SELECTORS, VARIANT_POLICIES, RunPlan, check_run_options

BASELINES = ("full_attention", "full_reuse")


@dataclass(frozen=True)
class BenchMethod:
    """One line of a benchmark: an engine method plus optional ablation overrides."""

    label: str
    method: str
    kv_variant: str | None = None
    selector: str | None = None
    variant_policy: str | None = None
    decode_kv_budget: int | None = None
    kv_shift: float | None = None

    def __post_init__(self) -> None:
        self.plan(0.0)  # the engine's validator: a bad name fails here, before any run

    def plan(self, ratio: float) -> RunPlan:
        """What the engine runs for this line at ``ratio`` (raises ``FusionRAGError``, a ValueError)."""
        return check_run_options(method=self.method, recompute_ratio=ratio, **self.overrides())

    @property
    def ratio_free(self) -> bool:
        """True when the recompute ratio does not change the result (computed once per question)."""
        return self.plan(0.0).ratio_free

    def engine_ratio(self, ratio: float | None) -> float:
        """The ratio passed to the engine (baselines ignore it; the engine validates [0, 1])."""
        if self.method == "full_attention":
            return 1.0
        return 0.0 if ratio is None else ratio

    def overrides(self) -> dict:
        return {"kv_variant": self.kv_variant, "selector": self.selector, "variant_policy": self.variant_policy,
                "decode_kv_budget": self.decode_kv_budget, "kv_shift": self.kv_shift}  # fmt: skip

    @property
    def needs_variant_notes(self) -> bool:
        """Its runs read Cache-Craft's notes on fused entries (the offline stage must store them)."""
        plan = self.plan(0.0)
        return plan.variant_policy in CFO_POLICIES or bool(METHODS[self.method].offline_metadata and plan.kv_variant == "fused")


def needs_variant_notes(methods) -> bool:
    """Whether any of ``methods`` (``BenchMethod``s) needs the notes (``FusionRAG.ingest(variant_notes=)``)."""
    return any(m.needs_variant_notes for m in methods)


def parse_method(spec: str) -> BenchMethod:
    """``"cacheblend"`` or ``"fused+kv_deviation"`` -> :class:`BenchMethod`.

    Example:
        >>> parse_method("plain+query_guided")
        BenchMethod(label='plain+query_guided', method='fusionrag_paper', kv_variant='plain', selector='query_guided', variant_policy=None, decode_kv_budget=None, kv_shift=None)
    """
    spec = spec.strip()
    base, at, budget = spec.rpartition("@")
    if at:
        if not budget.isdigit() or int(budget) < 1:
            raise ValueError(f"bad decode KV budget in {spec!r}: '@' must be followed by an int >= 1, e.g. 'a3@64'")
        found = parse_method(base)
        return BenchMethod(spec, found.method, found.kv_variant, found.selector, found.variant_policy, int(budget),
                           found.kv_shift)  # fmt: skip
    base, tilde, share = spec.rpartition("~")
    if tilde:
        try:
            value = float(share)
        except ValueError:
            value = -1.0
        if not 0 <= value <= 1:
            raise ValueError(f"bad kv_shift in {spec!r}: '~' must be followed by a number in [0, 1], e.g. 'fusionrag~0'")
        found = parse_method(base)
        return BenchMethod(spec, found.method, found.kv_variant, found.selector, found.variant_policy, kv_shift=value)
    base, colon, policy = spec.partition(":")
    if colon:
        if policy not in VARIANT_POLICIES:
            raise ValueError(f"unknown variant policy in {spec!r}: use one of {', '.join(VARIANT_POLICIES)}")
        return BenchMethod(spec, *_method_parts(base), policy)  # validated with the policy
    return BenchMethod(spec, *_method_parts(spec))


def _method_parts(spec: str) -> tuple[str, str | None, str | None]:
    """(method, kv_variant, selector) of a name or '<kv_variant>+<selector>', not yet validated together."""
    if spec in METHODS:
        return spec, None, None
    variant, plus, selector = spec.partition("+")
    if not plus or variant not in KV_VARIANTS or selector not in SELECTORS:
        raise ValueError(
            f"unknown method {spec!r}: use one of {', '.join(METHODS)} or an ablation "
            f"'<kv_variant>+<selector>' with kv_variant in {{{', '.join(KV_VARIANTS)}}} "
            f"and selector in {{{', '.join(SELECTORS)}}}, e.g. 'fused+kv_deviation'"
        )
    return "fusionrag_paper", variant, selector


def parse_methods(text: str) -> tuple[BenchMethod, ...]:
    """Comma-separated specs; the two baselines (needed for eq. 11) always come first, once each."""
    specs = [s for s in (part.strip() for part in text.split(",")) if s]
    if not specs:
        raise ValueError("--methods is empty; give at least one method, e.g. 'fusionrag'")
    methods = [parse_method(s) for s in (*BASELINES, *specs)]
    unique = {m.label: m for m in methods}
    return tuple(unique.values())


def _numbers(text: str, name: str, kind: type) -> list:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"--{name} is empty; give a comma-separated list")
    try:
        return [kind(p) for p in parts]
    except ValueError:
        raise ValueError(f"--{name} must be a comma-separated list of {kind.__name__}s, got {text!r}") from None


def parse_ratios(text: str) -> tuple[float, ...]:
    """Sorted, de-duplicated recompute ratios in [0, 1]."""
    ratios = _numbers(text, "ratios", float)
    bad = [r for r in ratios if not 0.0 <= r <= 1.0]
    if bad:
        raise ValueError(f"--ratios must lie in [0, 1], got {bad}")
    return tuple(sorted(set(ratios)))


def parse_lengths(text: str) -> tuple[int, ...]:
    """Sorted, de-duplicated prompt lengths in tokens (each >= 16)."""
    lengths = _numbers(text, "lengths", int)
    bad = [n for n in lengths if n < 16]
    if bad:
        raise ValueError(f"--lengths must be token counts >= 16, got {bad}")
    return tuple(sorted(set(lengths)))


def jobs(methods: tuple[BenchMethod, ...], ratios: tuple[float, ...]) -> list[tuple[BenchMethod, float | None]]:
    """(method, ratio) pairs to run; ratio-free methods appear once with ratio ``None``."""
    out: list[tuple[BenchMethod, float | None]] = []
    for method in methods:
        out.extend([(method, None)] if method.ratio_free else [(method, r) for r in ratios])
    return out
