"""Cache-Craft's rules (paper 003, sections 3.1-3.3), in plain Python over a few numbers per chunk.

A stored chunk variant was computed after some chunks (its *old prefix*: none for a plain entry,
its neighbours for a fused one). What Cache-Craft keeps about each variant, measured once when the
variant is computed (``VariantNotes``):

* ``inter``: how much attention the chunk's tokens gave each old-prefix chunk (eq. 3);
* ``cci``: the Cache Context Impact, sigmoid(a / b) of the length-normalised attention to the
  prefix chunks (a) over that inside the chunk itself (b), averaged over layers (eqs. 9-11);
* ``order``: the chunk's token indices, most attention to the prefix chunks first (eq. 14).

For a request, each variant gets the Adjusted Prefix Overlap (beta', eqs. 6-8: the share of its
``inter`` that goes to chunks also in front of it now, discounted by the Kendall tau distance
between their old and new order) and the Cache Fix Overhead CFO = alpha * CCI * (1 - beta')
(eq. 12): the share of its tokens to recompute. The variant with the lowest CFO serves the chunk.

Where the paper is silent, this module chooses (and ``docs/ARCHITECTURE.md`` says so):

* a plain entry has no prefix chunks, so a = 0 and its CCI is sigmoid(0) = 0.5; its beta is 1 in
  front of no chunk (the request's first chunk: nothing to match) and 0 otherwise;
* attention inside the chunk (b) counts each token's attention to itself;
* a plain entry has no attention to prefix chunks to rank its tokens by; it uses the ranking its
  chunk's fused variant measured when there is one (which tokens look outside their chunk is
  mostly a property of the tokens), else the chunk's first tokens first.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from fusionrag_llm.kernels.dispatch import critical_scores
from fusionrag_llm.models.attention import attend, causal_tail_start
from fusionrag_llm.models.forward import LayerHook

logger = logging.getLogger(__name__)
PLAIN_CCI = 0.5  # sigmoid(0): no prefix chunk, no outside attention
FOCUS_WINDOW = 3  # layers the focused set must stay the same before recompute of the others stops
META_KEY = "craft"  # where a variant's notes live in its entry's meta


@dataclass(frozen=True)
class VariantNotes:
    """What a stored variant knows about the context it was computed in."""

    prefix: tuple[str, ...]  # catalog ids of the chunks before it, in order (empty: a plain entry)
    inter: tuple[float, ...]  # attention from its tokens to each prefix chunk, summed over layers
    cci: float
    order: tuple[int, ...] = ()  # its token indices, most contextualised first; () = unknown

    def to_meta(self) -> dict:
        return {"inter": [round(x, 6) for x in self.inter], "cci": round(self.cci, 6), "order": list(self.order)}

    @classmethod
    def from_meta(cls, meta: dict, prefix: Sequence[str], length: int) -> "VariantNotes | None":
        """The notes stored in an entry's meta; None when it has none or they do not fit the entry."""
        notes = meta.get(META_KEY)
        if not isinstance(notes, dict):
            return None
        try:
            inter = tuple(float(x) for x in notes["inter"])
            cci, order = float(notes["cci"]), tuple(int(i) for i in notes["order"])
        except (KeyError, TypeError, ValueError):
            return None
        if len(inter) != len(prefix) or sorted(order) != list(range(length)) or not 0.0 <= cci <= 1.0:
            return None
        return cls(tuple(prefix), inter, cci, order)


def plain_notes() -> VariantNotes:
    return VariantNotes((), (), PLAIN_CCI)


_warned_notes = False


def fused_notes(meta: dict, length: int) -> VariantNotes:
    """A fused entry's notes from its ``meta``; an entry computed before they were kept gets the most
    cautious ones (CCI 1, every neighbour alike, no token order), with one warning per process."""
    global _warned_notes
    prefix = meta.get("neighbours") or []
    notes = VariantNotes.from_meta(meta, prefix, length)
    if notes is None:
        if not _warned_notes:
            logger.warning("fused entries without Cache-Craft notes (ingested without variant_notes=True): their "
                           "variant choice assumes the most context dependence; add_chunks(..., variant_notes=True) "
                           "measures it")  # fmt: skip
            _warned_notes = True
        notes = VariantNotes(tuple(prefix), (1.0,) * len(prefix), 1.0)
    return notes


class NotesRecorder(LayerHook):
    """Measures a variant's notes during the forward that computes it (a ``LayerHook``).

    The chunk's tokens are the step's rows; ``prefix_spans`` are the cache slots of each prefix
    chunk. At every layer, the rows' attention weights (averaged over heads) give that layer's
    inter / intra sums; ``notes`` turns the per-layer sums into the variant's notes."""

    def __init__(self, prefix: Sequence[str], prefix_spans: Sequence[tuple[int, int]], chunk_span: tuple[int, int]):
        self.prefix, self.prefix_spans, self.chunk_span = tuple(prefix), list(prefix_spans), chunk_span
        self.a: list[float] = []
        self.b: list[float] = []
        self.inter = torch.zeros(len(self.prefix_spans), dtype=torch.float64)
        self.outside: torch.Tensor | None = None  # per chunk token, attention to the prefix chunks

    def after_write(self, layer: int, q: torch.Tensor, cache, step) -> None:
        spans = [*self.prefix_spans, self.chunk_span]
        mass = span_attention(q, cache, layer, step, spans).mean(dim=0).double().cpu()  # [n, prefix chunks + 1]
        n = mass.shape[0]
        per_chunk = mass[:, :-1]
        sizes = torch.tensor([e - s for s, e in self.prefix_spans], dtype=torch.float64)
        self.inter += per_chunk.sum(dim=0)
        self.a.append(float((per_chunk.sum(dim=0) / (n * sizes)).sum()) if self.prefix_spans else 0.0)
        self.b.append(float(mass[:, -1].sum()) / n**2)
        outside = per_chunk.sum(dim=1)
        self.outside = outside if self.outside is None else self.outside + outside

    def notes(self) -> VariantNotes:
        a, b = sum(self.a) / max(len(self.a), 1), sum(self.b) / max(len(self.b), 1)
        cci = _sigmoid(a / b) if b > 0 else 1.0
        order = () if self.outside is None else tuple(torch.argsort(self.outside, descending=True, stable=True).tolist())
        return VariantNotes(self.prefix, tuple(self.inter.tolist()), cci, order if self.prefix else ())


def span_attention(q: torch.Tensor, cache, layer: int, step, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """[heads, n, len(spans)]: the softmax weight each query of ``step`` (q [heads, n, d], rotated)
    gives the cache slots of each span at ``layer``, under the step's causal position mask.

    The weights are never materialised: attention over values that are the spans' indicator vectors
    (one column per span) sums them, through the same fused kernels as the forward's attention."""
    n, dim = cache.length, q.shape[-1]
    if len(spans) > dim:
        raise ValueError(f"at most {dim} spans per attention call, got {len(spans)}")
    indicator = torch.zeros(n, dim, dtype=q.dtype, device=q.device)
    for column, (start, end) in enumerate(spans):
        indicator[start:end, column] = 1.0
    keys = cache.keys[layer, :, :n]
    values = indicator.expand(keys.shape[0], n, dim)
    tail = causal_tail_start(step.slots, step.positions, cache.positions, cache.valid, n)
    mask = None if tail is not None else cache.attention_mask(step.positions)[None, None]
    return attend(q, keys, values, mask, tail)[..., : len(spans)]


def kendall_distance(old: Sequence[str], new: Sequence[str]) -> float:
    """Normalised Kendall tau distance (eq. 7) between the orders of the same items: discordant pairs
    over all pairs; 0 for fewer than two items."""
    m = len(old)
    if m < 2:
        return 0.0
    rank = {item: i for i, item in enumerate(new)}
    discordant = sum(rank[old[i]] > rank[old[j]] for i in range(m) for j in range(i + 1, m))
    return discordant / (m * (m - 1) / 2)


def adjusted_overlap(notes: VariantNotes, new_prefix: Sequence[str]) -> float:
    """beta' (eq. 8): the share of the variant's prefix attention that goes to chunks in front of it
    in this request too, times one minus the Kendall distance of their two orders."""
    if not notes.prefix:
        return 1.0 if not new_prefix else 0.0
    present = set(new_prefix)
    total = sum(notes.inter)
    shared = [c for c in notes.prefix if c in present]
    if total <= 0:
        beta = len(shared) / len(notes.prefix)
    else:
        beta = sum(w for c, w in zip(notes.prefix, notes.inter) if c in present) / total
    new_order = [c for c in new_prefix if c in set(shared)]
    return beta * (1.0 - kendall_distance(shared, new_order))


def fix_overhead(notes: VariantNotes, new_prefix: Sequence[str], alpha: float = 1.0) -> float:
    """CFO (eq. 12): the share of the chunk's tokens to recompute when this variant serves it."""
    return min(1.0, alpha * notes.cci * (1.0 - adjusted_overlap(notes, new_prefix)))


def chunk_budgets(overheads: Sequence[float], lengths: Sequence[int], k: int) -> list[int]:
    """Tokens to recompute in each chunk, ``k`` in all, shared in proportion to CFO x length (the
    paper's ceil(CFO |C|) per chunk, scaled so the request's total is the run's budget); no chunk
    gets more than its length, and what a full chunk cannot take goes to the others. Rounding
    leftovers go to the largest remainders. When no chunk needs fixing by the rule, by length."""
    want = [max(o, 0.0) * n for o, n in zip(overheads, lengths)]
    if sum(want) <= 0:
        want = [float(n) for n in lengths]
    budgets = [0] * len(lengths)
    remaining = min(max(k, 0), sum(lengths))
    active = [i for i, n in enumerate(lengths) if n > 0 and want[i] > 0]
    while remaining > 0 and active:
        total = sum(want[i] for i in active)
        shares = {i: remaining * want[i] / total for i in active}
        full = [i for i in active if budgets[i] + shares[i] >= lengths[i]]
        if full:  # these take all they can; share the rest again among the others
            for i in full:
                remaining -= lengths[i] - budgets[i]
                budgets[i] = lengths[i]
            active = [i for i in active if i not in full]
            continue
        for i in active:
            budgets[i] += int(shares[i])
        leftover = remaining - sum(int(shares[i]) for i in active)
        for i in sorted(active, key=lambda i: (-(shares[i] - int(shares[i])), -want[i], i))[:leftover]:
            budgets[i] += 1
        remaining = 0
    return budgets


def focused_chunks(cumulative: Sequence[float]) -> frozenset[int]:
    """Algorithm 1, lines 4-9: the chunks (indices) whose cumulative question attention stands out.

    Sorted descending, the gaps between neighbours are normalised to a distribution p; its running
    entropy h_i = -sum_{j<=i} p_j log p_j; the focused set is the top i* chunks, where i* is the
    i in [1, k-2] with the largest step h_{i+1} - h_i. Fewer than three chunks: all are focused."""
    k = len(cumulative)
    if k < 3:
        return frozenset(range(k))
    order = sorted(range(k), key=lambda i: (-cumulative[i], i))
    values = [cumulative[i] for i in order]
    gaps = [values[i] - values[i + 1] for i in range(k - 1)]
    total = sum(gaps)
    if total <= 0:
        return frozenset(range(k))
    p = [g / total for g in gaps]
    terms = [-x * math.log(x) if x > 0 else 0.0 for x in p]  # h_{i+1} - h_i = terms[i] (0-based i = 1..k-2)
    best = max(range(1, k - 1), key=lambda i: (round(terms[i], 9), -i))  # ties (to rounding): fewer chunks
    return frozenset(order[:best])


class FocusTracker(LayerHook):
    """Adaptive early recompute termination (section 3.2.2) during a sparse prefill (a ``LayerHook``).

    At every layer the question's attention to each chunk is added up; once the focused set
    (``focused_chunks``) has stayed the same for ``window`` layers, ``keep`` marks the step's rows to
    go on with: every row except the recomputed tokens of chunks outside the focused set, whose KV
    in the later layers stays the reused one."""

    def __init__(self, rows: torch.Tensor, suffix_slots: torch.Tensor, chunk_spans: Sequence[tuple[int, int]],
                 droppable: torch.Tensor, kernels: str = "torch", window: int | None = None):  # fmt: skip
        self.rows, self.spans = rows, list(chunk_spans)
        self.suffix_rows = torch.isin(rows, suffix_slots)
        self.droppable = droppable  # [n] bool: rows that are recomputed chunk tokens
        self.kernels, self.window = kernels, window or FOCUS_WINDOW
        self.cumulative = [0.0] * len(self.spans)
        self.history: list[frozenset[int]] = []
        self.keep: torch.Tensor | None = None
        self.cutoff: int | None = None
        self.focused: frozenset[int] | None = None

    def after_write(self, layer: int, q: torch.Tensor, cache, step) -> None:
        if self.keep is not None or len(self.spans) < 3:
            return
        n = cache.length
        scores = critical_scores(q[:, self.suffix_rows], step.positions[self.suffix_rows], cache.keys[layer, :, :n],
                                 cache.positions[:n], cache.valid[:n], backend=self.kernels).float()  # fmt: skip
        for i, (start, end) in enumerate(self.spans):
            self.cumulative[i] += float(scores[start:end].sum())
        self.history.append(focused_chunks(self.cumulative))
        recent = self.history[-self.window :]
        if len(recent) == self.window and all(f == recent[0] for f in recent):
            self.cutoff, self.focused = layer, recent[0]
            in_unfocused = torch.zeros_like(self.droppable)
            for i, (start, end) in enumerate(self.spans):
                if i not in self.focused:
                    in_unfocused |= (self.rows >= start) & (self.rows < end)
            self.keep = ~(self.droppable & in_unfocused)

    @property
    def dropped(self) -> int:
        return 0 if self.keep is None else int((~self.keep).sum())


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0
