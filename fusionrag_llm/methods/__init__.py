"""The methods the engine runs, by name: one module each, one line each in ``_BUILT_IN``.

A method from outside the package is a ``Method`` subclass passed to ``register_method`` (README, "Add your
own method"); ``rag.generate(..., method=name)`` then runs it like a built-in one. ``get_method``
returns a method with options set (``get_method("a3", decode_kv_budget=128)``); an instance can be
passed as ``method=`` too.

    >>> method_names()[:3]
    ('full_attention', 'full_reuse', 'cacheblend')
    >>> make_plan("full_reuse", 0.5).recompute_ratio  # selects nothing: the ratio does not apply
    0.0
    >>> make_plan("fusionrag").recompute_ratio  # the method's own default
    0.15
"""

from __future__ import annotations

from dataclasses import fields

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.methods.a3 import A3
from fusionrag_llm.methods.ape import APE
from fusionrag_llm.methods.base import CHUNK_KV, Method, MethodRun, Prefill, RunPlan
from fusionrag_llm.methods.cache_craft import CacheCraft
from fusionrag_llm.methods.cacheblend import CacheBlend
from fusionrag_llm.methods.cacheclip import CacheClip
from fusionrag_llm.methods.epic import Epic
from fusionrag_llm.methods.full_attention import FullAttention
from fusionrag_llm.methods.full_reuse import FullReuse
from fusionrag_llm.methods.fusionrag import FusionRAGBlend
from fusionrag_llm.methods.fusionrag_paper import FusionRAGPaper

_BUILT_IN = (FullAttention, FullReuse, CacheBlend, FusionRAGBlend, FusionRAGPaper, A3, Epic, CacheClip, CacheCraft, APE)
_REGISTRY: dict[str, type[Method]] = {}


def register_method(method: type[Method], *, replace: bool = False) -> type[Method]:
    """Make ``method`` (a ``Method`` subclass with a ``name``) runnable by name; returns it, so it
    also works as a class decorator. A name already taken is refused unless ``replace=True``."""
    if not (isinstance(method, type) and issubclass(method, Method)):
        raise FusionRAGError(f"register_method takes a Method subclass, got {method!r}")
    name = method.name
    if not isinstance(name, str) or not name.isidentifier():
        raise FusionRAGError(f"a method's name must be a Python identifier, got {name!r}")
    if method.chunk_kv not in CHUNK_KV:
        raise FusionRAGError(f"method {name!r}: chunk_kv must be one of {CHUNK_KV}, got {method.chunk_kv!r}")
    if name in _REGISTRY and _REGISTRY[name] is not method and not replace:
        raise FusionRAGError(f"a method named {name!r} is already registered; pass replace=True to replace it")
    method().check_ratio(method.default_ratio)
    _REGISTRY[name] = method
    return method


def method_names() -> tuple[str, ...]:
    """The registered methods' names, built-in ones first."""
    return tuple(_REGISTRY)


def get_method(name: str | Method, **options) -> Method:
    """The method ``name`` with ``options`` (its dataclass fields); an instance is returned as it is."""
    if isinstance(name, Method):
        if options:
            raise FusionRAGError("options go to get_method(name, ...) or the method's constructor, not both")
        return name
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise FusionRAGError(f"unknown method {name!r}; valid methods: {', '.join(_REGISTRY)}")
    allowed = [f.name for f in fields(cls)]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        takes = f"it takes {', '.join(allowed)}" if allowed else "it takes none"
        raise FusionRAGError(f"unknown option(s) {', '.join(unknown)} for method {cls.name!r}; {takes}")
    return cls(**options)


def make_plan(method: str | Method = "fusionrag", recompute_ratio: float | None = None,
              reproducible: bool | None = None) -> RunPlan:  # fmt: skip
    """A request's method and ratio, checked (``None``: the method's own ratio); ``reproducible``: see
    ``RunPlan`` (None: the engine's setting)."""
    chosen = get_method(method)
    if reproducible is not None and not isinstance(reproducible, bool):
        raise FusionRAGError(f"reproducible must be True, False or None (the engine's setting), got {reproducible!r:.40}")
    return RunPlan(chosen, chosen.check_ratio(recompute_ratio), reproducible)


for _method in _BUILT_IN:
    register_method(_method)

__all__ = ["Method", "MethodRun", "Prefill", "RunPlan", "get_method", "make_plan", "method_names", "register_method"]
