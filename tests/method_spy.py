"""A method that records what the engine hands it, for tests that look inside one request through the
method protocol instead of the engine's privates.

``spy("a3", decode_kv_budget=8)`` returns ``(method, seen)``: an instance of a subclass of the named
method's class (same name, options and behaviour) whose ``start`` appends one ``Seen`` per request to
``seen``: the ``Prefill`` the engine built, the ``MethodRun`` the method returned, and a copy of the
request cache as it was then (chunk KV placed and the selection made, before the sparse prefill).
Pass the instance as ``method=`` (or to ``make_plan``)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from fusionrag_llm.methods import Method, MethodRun, Prefill, get_method
from fusionrag_llm.models.kv_cache import KVCache


@dataclass
class Seen:
    prefill: Prefill
    run: MethodRun
    placed: KVCache  # the request cache when the method started (a copy)

    @property
    def layout(self):
        return self.prefill.layout


def spy(method: str | Method, **options) -> tuple[Method, list[Seen]]:
    base = get_method(method, **options) if isinstance(method, str) else method
    seen: list[Seen] = []

    class Spy(type(base)):
        def start(self, prefill: Prefill) -> MethodRun:
            prefill.cache.settle()  # a layer feed still loading: every layer in before the copy
            placed = prefill.cache.fork()
            run = super().start(prefill)
            seen.append(Seen(prefill, run, placed))
            return run

    Spy.__name__ = Spy.__qualname__ = f"Spy{type(base).__name__}"
    return Spy(**{f.name: getattr(base, f.name) for f in fields(base)}), seen
