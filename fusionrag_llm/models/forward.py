"""What one forward call computes, and the metadata its layers share.

A forward runs one or several sequences at once. Every sequence brings a ``ForwardPass`` (its
tokens, their absolute positions and the slots of its own ``KVCache`` they write) and gets back a
``ForwardOutput``. The linear layers see all sequences' tokens as one matrix; attention runs per
sequence over that sequence's cache (or, over caches of one pool, for every sequence in one call:
``models/kv_pool.py``). ``BatchContext`` carries what every layer needs (row spans,
rotary tables, each sequence's attention metadata, what to capture) so layer signatures stay short.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from fusionrag_llm.models.kv_cache import KVCache


class LayerHook:
    """A method's work inside every layer of a prefill; both calls default to nothing.

    ``before_write`` sees the step's new K/V rows ([kv_heads, n, d], rotated) once the layer's stored
    KV is in the cache and before the rows are written (``writes_kv``: it changes the cache there).
    ``after_write`` sees the rotated queries [heads, n, d] once they are. A hook that sets ``keep`` to a
    [n] bool mask makes the later layers run only those rows (the others keep the KV they have); rows
    with logits must be kept.
    """

    keep: torch.Tensor | None = None
    writes_kv = False

    def before_write(self, layer: int, cache: KVCache, keys: torch.Tensor, values: torch.Tensor) -> None:
        pass

    def after_write(self, layer: int, queries: torch.Tensor, cache: KVCache, step: "ForwardPass") -> None:
        pass


@dataclass(frozen=True)
class AttentionScaling:
    """APE's rescaled attention: computed queries see the ``slots`` marked True with logits divided by
    ``temperature`` and softmax weights multiplied by ``scale`` (then renormalised over all keys)."""

    slots: torch.Tensor  # [capacity] bool, over the request cache's slots
    temperature: float
    scale: float


@dataclass
class ForwardPass:
    """One sequence's part of a forward call."""

    token_ids: torch.Tensor  # [n] int64
    positions: torch.Tensor  # [n] int64 absolute positions
    slots: torch.Tensor  # [n] where the tokens' K/V go in the cache
    logit_rows: torch.Tensor | None = None  # rows of the n tokens to produce logits for; None = all
    capture_query_layers: frozenset[int] = frozenset()  # layers whose rotated queries to return
    capture_raw_kv: bool = False  # return pre-rotary keys and values of the n tokens, all layers
    groups: torch.Tensor | None = None  # [n] int32 attention groups (see KVCache.attention_mask)
    decode: bool = False  # a decode step: may read the quantized weights (``DecoderLM.quantize_linears``)
    # a method's per-layer work in this step (``LayerHook``), in the order given
    hooks: tuple["LayerHook", ...] = ()
    scaling: AttentionScaling | None = None  # a method's rescaled attention (APE); None: plain softmax
    # the maker expects its tokens scattered through the cache (a sparse prefill): the Triton backend then
    # attends them with the sparse kernel without asking whether they form a causal block ending the
    # cache, which on a device is a read back from it. The same result either way.
    scattered: bool = False

    def narrowed(self, keep: torch.Tensor) -> "ForwardPass":
        """The same step with only the ``keep`` rows (without the hook that decided it)."""
        if self.capture_raw_kv or self.capture_query_layers or any(hook.writes_kv for hook in self.hooks):
            raise ValueError("a step that captures K/V or queries, or shifts reused KV, cannot drop rows part way")
        logit_rows = None
        if self.logit_rows is not None:
            if not bool(keep[self.logit_rows].all()):
                raise ValueError("a step cannot drop the rows it returns logits for")
            logit_rows = (torch.cumsum(keep.long(), 0) - 1)[self.logit_rows]
        elif not bool(keep.all()):
            raise ValueError("a step that returns logits for every row cannot drop rows")
        groups = None if self.groups is None else self.groups[keep]
        return ForwardPass(self.token_ids[keep], self.positions[keep], self.slots[keep], logit_rows,
                           groups=groups, decode=self.decode, hooks=tuple(h for h in self.hooks if h.keep is None),
                           scaling=self.scaling, scattered=self.scattered)  # fmt: skip


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [len(logit_rows), vocab] float32
    queries: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [heads, n, head_dim]
    raw_keys: torch.Tensor | list | None = None  # [layers, kv_heads, n, head_dim], before rotary
    raw_values: torch.Tensor | list | None = None  # [layers, kv_heads, n, head_dim]


@dataclass
class BatchContext:
    """One forward's metadata: built once, read by every layer."""

    steps: list[ForwardPass]
    caches: list[KVCache]
    spans: list[tuple[int, int]]  # rows [start, end) of each sequence in the stacked tokens
    rotate: Callable[[torch.Tensor], torch.Tensor]  # [..., n_total, d] -> rotated to every token's position
    attention: Any  # the model's AttentionBackend
    metas: list[Any]  # per sequence: what the backend prepared (masks, fast-path flags)
    outputs: list[ForwardOutput]
    # the rotary cos/sin [n_total, d] that ``rotate`` applies (torch backend), or None (Triton computes its own)
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None
    # the sequences that attend in one call, their caches in one pool: one write and one attention call
    # per layer (``models/attention_backend.PooledStep``), or None: every sequence on its own
    pooled: Any = None

    def capture_raw_kv(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep the pre-rotary K/V rows of the sequences that asked for them."""
        for step, out, (start, end) in zip(self.steps, self.outputs, self.spans):
            if step.capture_raw_kv:
                out.raw_keys.append(k[:, start:end])
                out.raw_values.append(v[:, start:end])

    def capture_queries(self, layer: int, q: torch.Tensor) -> None:
        for step, out, (start, end) in zip(self.steps, self.outputs, self.spans):
            if layer in step.capture_query_layers:
                out.queries[layer] = q[:, start:end]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write each sequence's rotated K/V into its cache, then attend: the pooled sequences (``pooled``)
        in one call, the others one by one.

        q [heads, n_total, d], k/v [kv_heads, n_total, d] -> [heads, n_total, d]."""
        pooled = self.pooled
        if pooled is None and len(self.steps) == 1:
            return self._attend_alone(0, layer, q, k, v)
        if pooled is not None and pooled.members is None:
            return self._attend_pooled(layer, q, k, v)
        # token-major, so the output projection reads its [n_total, heads * d] rows as a view
        out = torch.empty((q.shape[1], q.shape[0], q.shape[2]), dtype=q.dtype, device=q.device).transpose(0, 1)
        members = set() if pooled is None else set(pooled.members)
        if members:
            out[:, pooled.rows] = self._attend_pooled(layer, q, k, v)
        for i, (start, end) in enumerate(self.spans):
            if i not in members:
                out[:, start:end] = self._attend_alone(i, layer, q, k, v)
        return out

    def _attend_pooled(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The pooled sequences' K/V written with one indexed write, their queries attended with one call."""
        pooled = self.pooled
        members = range(len(self.steps)) if pooled.members is None else pooled.members
        hooked = members if pooled.per_sequence else ()
        for i in hooked:
            (start, end), cache = self.spans[i], self.caches[i]
            cache.ready(layer)
            for hook in self.steps[i].hooks:
                hook.before_write(layer, cache, k[:, start:end], v[:, start:end])
        rows = slice(None) if pooled.rows is None else pooled.rows
        pooled.pool.keys[layer][:, pooled.slots] = k[:, rows]
        pooled.pool.values[layer][:, pooled.slots] = v[:, rows]
        for i in hooked:
            start, end = self.spans[i]
            for hook in self.steps[i].hooks:
                hook.after_write(layer, q[:, start:end], self.caches[i], self.steps[i])
        return self.attention.attend_pooled(q[:, rows], pooled, layer)

    def _attend_alone(self, i: int, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Sequence ``i``'s write and attention over its own cache."""
        step, cache, meta, (start, end) = self.steps[i], self.caches[i], self.metas[i], self.spans[i]
        cache.ready(layer)  # stored KV loading layer by layer: this layer's is in before it is read
        for hook in step.hooks:
            hook.before_write(layer, cache, k[:, start:end], v[:, start:end])
        cache.keys[layer][:, step.slots] = k[:, start:end]
        cache.values[layer][:, step.slots] = v[:, start:end]
        for hook in step.hooks:
            hook.after_write(layer, q[:, start:end], cache, step)
        return self.attention(q[:, start:end], cache, layer, step, meta)


def spans_of(steps: list[ForwardPass]) -> list[tuple[int, int]]:
    spans, start = [], 0
    for step in steps:
        spans.append((start, start + len(step.token_ids)))
        start += len(step.token_ids)
    return spans
