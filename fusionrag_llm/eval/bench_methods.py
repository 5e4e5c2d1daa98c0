"""Benchmark method lists and option parsing (plain Python, no tensors).

A benchmark line is a method the engine registers (``fusionrag_llm.method_names()``: ``full_attention``,
``full_reuse``, ``cacheblend``, ``fusionrag``, ``fusionrag_paper``, ... and any registered from
``bench/methods/``) at a recompute ratio, written ``method@ratio`` in tables. A method that selects
nothing (Full Attention recomputes everything, Full Reuse and APE nothing) does not depend on the
ratio, so it runs once per question, with ratio ``None``.

Example:
    >>> parse_methods("cacheblend,fusionrag")
    ('full_attention', 'full_reuse', 'cacheblend', 'fusionrag')
    >>> parse_ratios("0.15,0,1")
    (0.0, 0.15, 1.0)
    >>> jobs(("full_attention", "fusionrag"), (0.0, 0.15))
    [('full_attention', None), ('fusionrag', 0.0), ('fusionrag', 0.15)]
"""

from __future__ import annotations

BASELINES = ("full_attention", "full_reuse")


def parse_methods(text: str) -> tuple[str, ...]:
    """Comma-separated method names; the two baselines (needed for eq. 11) always come first, once each."""
    from fusionrag_llm import method_names

    names = [s for s in (part.strip() for part in text.split(",")) if s]
    if not names:
        raise ValueError("--method is empty; give at least one method, e.g. 'fusionrag'")
    unknown = [name for name in names if name not in method_names()]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; valid methods: {', '.join(method_names())}")
    return tuple(dict.fromkeys((*BASELINES, *names)))


def jobs(methods: tuple[str, ...], ratios: tuple[float, ...]) -> list[tuple[str, float | None]]:
    """(method, ratio) pairs to run; the baselines appear once with ratio ``None``."""
    out: list[tuple[str, float | None]] = []
    for method in methods:
        out.extend([(method, None)] if ratio_free(method) else [(method, r) for r in ratios])
    return out


def needs_variant_notes(methods: tuple[str, ...]) -> bool:
    """Whether a method of the run reads notes stored with the fused entries (Cache-Craft's), which
    the offline stage then has to measure."""
    from fusionrag_llm import get_method

    return any(get_method(name).offline_notes for name in methods)


def ratio_free(method: str) -> bool:
    """Whether the ratio cannot change ``method``'s answers (it selects no token to recompute)."""
    from fusionrag_llm import get_method

    return not get_method(method).selects


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
        raise ValueError(f"--ratio must lie in [0, 1], got {bad}")
    return tuple(sorted(set(ratios)))


def parse_lengths(text: str) -> tuple[int, ...]:
    """Sorted, de-duplicated prompt lengths in tokens (each >= 16)."""
    lengths = _numbers(text, "lengths", int)
    bad = [n for n in lengths if n < 16]
    if bad:
        raise ValueError(f"--lengths must be token counts >= 16, got {bad}")
    return tuple(sorted(set(lengths)))
