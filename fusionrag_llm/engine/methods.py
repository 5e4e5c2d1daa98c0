"""The methods one engine runs, as (KV variant, selector) pairs with validated knobs."""

from __future__ import annotations

from dataclasses import dataclass

from fusionrag_llm.errors import FusionRAGError

KV_VARIANTS = ("plain", "fused")
SELECTORS = ("query_guided", "kv_deviation", "random", "oracle", "none")


@dataclass(frozen=True)
class MethodSpec:
    name: str
    kv_variant: str | None  # None: no chunk reuse at all (full attention)
    selector: str


METHODS = {
    "full_attention": MethodSpec("full_attention", None, "none"),
    "full_reuse": MethodSpec("full_reuse", "plain", "none"),
    "cacheblend": MethodSpec("cacheblend", "plain", "kv_deviation"),
    "fusionrag": MethodSpec("fusionrag", "fused", "query_guided"),
}


@dataclass(frozen=True)
class RunPlan:
    """What one request runs: where chunk KV comes from, how tokens are selected, how many."""

    method: str
    kv_variant: str | None
    selector: str
    recompute_ratio: float
    seed: int = 0

    @property
    def reuses_chunks(self) -> bool:
        return self.kv_variant is not None


def plan_run(method: str, recompute_ratio: float, kv_variant: str | None = None,
             selector: str | None = None, seed: int = 0) -> RunPlan:  # fmt: skip
    """Validate the knobs; ``kv_variant``/``selector`` override the method's own (ablations)."""
    if method not in METHODS:
        raise FusionRAGError(f"unknown method {method!r}; valid methods: {', '.join(METHODS)}")
    if kv_variant is not None and kv_variant not in KV_VARIANTS:
        raise FusionRAGError(f"unknown kv_variant {kv_variant!r}; valid: {', '.join(KV_VARIANTS)}")
    if selector is not None and selector not in SELECTORS:
        raise FusionRAGError(f"unknown selector {selector!r}; valid selectors: {', '.join(SELECTORS)}")
    if isinstance(recompute_ratio, bool) or not isinstance(recompute_ratio, (int, float)) or not 0 <= recompute_ratio <= 1:
        raise FusionRAGError(f"recompute_ratio must be a number in [0, 1], got {recompute_ratio!r}")
    spec = METHODS[method]
    if spec.kv_variant is None:
        if kv_variant is not None or selector not in (None, "none"):
            raise FusionRAGError("full_attention reuses no chunk KV; kv_variant and selector do not apply to it")
        return RunPlan(method, None, "none", 1.0, seed)
    chosen_selector = selector or spec.selector
    ratio = 0.0 if chosen_selector == "none" else float(recompute_ratio)
    return RunPlan(method, kv_variant or spec.kv_variant, chosen_selector, ratio, seed)
