"""`EntryForm`: the form a reader can use an entry in (its model's layers, kv heads and head dim, the
dtype or packing its store keeps), and the check of every entry read against it.

A store is untrusted: its bytes are checked by the frame, its identity by the key binding, but an
entry can still be well-formed and wrong for the model that reads it (a 1-layer or 1-head entry
would broadcast over every layer or head, another head dim fails inside torch), or hold NaN or
infinite values (NaN answers). So a reader states its form and refuses what does not fit; the engine
treats a refused entry as a miss and recomputes it. Token ids are the store's to check
(`TieredStore.get(expect_token_ids=...)`), and `KVEntry` holds one token count for all its tensors.

Example:
    >>> import torch
    >>> from fusionrag_llm.storage.entry import KVEntry
    >>> form = EntryForm(num_layers=2, num_kv_heads=1, head_dim=4, dtype="float32")
    >>> kv = torch.zeros(2, 1, 3, 4)
    >>> form.problem(KVEntry((1, 2, 3), kv, kv.clone())) is None
    True
    >>> form.problem(KVEntry((1, 2, 3), kv[:1], kv[:1].clone()))
    '[layers, kv heads, head dim] is [1, 1, 4], the reader expects [2, 1, 4]'
    >>> kv[0, 0, 1, 2] = float("nan")
    >>> form.problem(KVEntry((1, 2, 3), kv, kv.clone()))
    'it holds NaN or infinite values'
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch

from .entry import KVEntry
from .quantize import SCHEMES, scheme_of

# Entries found finite, by identity: a memory tier hands out the same entry to every reader, whose
# values nobody may change (`TieredStore.get(copy=False)`), so each is summed once, not per request.
_FINITE: weakref.WeakSet[KVEntry] = weakref.WeakSet()
_FINITE_LOCK = threading.Lock()


@dataclass(frozen=True)
class EntryForm:
    """An entry's expected layout: `[num_layers, num_kv_heads, T, head_dim]`, unpacked in `dtype` (a
    torch dtype name) or, when `scheme` names a quantization scheme (`quantize.SCHEMES`), packed by it."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str | None = None
    scheme: str | None = None

    def __post_init__(self) -> None:
        sizes = (self.num_layers, self.num_kv_heads, self.head_dim)
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
            raise ValueError(f"num_layers, num_kv_heads and head_dim must be ints >= 1, got {sizes}")
        if (self.dtype is None) == (self.scheme is None):
            raise ValueError("give an EntryForm either a dtype (unpacked entries) or a scheme (packed ones)")
        if self.dtype is not None and not isinstance(getattr(torch, self.dtype, None), torch.dtype):
            raise ValueError(f"dtype must name a torch dtype (e.g. 'float32'), got {self.dtype!r}")
        if self.scheme is not None and self.scheme not in SCHEMES:
            raise ValueError(f"unknown quantization scheme {self.scheme!r}; allowed: {', '.join(SCHEMES)}")

    @property
    def expected(self) -> str:
        return f"{self.scheme}-packed" if self.scheme is not None else self.dtype

    def problem(self, entry: KVEntry) -> str | None:
        """Why `entry` cannot be used in this form (None: it can): its dtype or packing, its shape,
        or values that are not finite (checked last: it reads every value, one sum per tensor)."""
        try:  # small heads fit two int4 layouts: the reader's own first
            scheme = scheme_of(entry, prefer=SCHEMES[self.scheme] if self.scheme is not None else None)
        except ValueError as exc:
            return f"it is packed in no known way ({exc})"
        if scheme is None and (self.dtype is None or entry.dtype != getattr(torch, self.dtype)):
            return f"it is {str(entry.dtype).removeprefix('torch.')}, the reader expects {self.expected}"
        if scheme is not None and scheme.name != self.scheme:
            return f"it is {scheme.name}-packed, the reader expects {self.expected}"
        layers, heads, _, width = entry.keys.shape
        head_dim = 2 * width if scheme is not None and scheme.packed_int4 else width
        if (layers, heads, head_dim) != (self.num_layers, self.num_kv_heads, self.head_dim):
            return (f"[layers, kv heads, head dim] is [{layers}, {heads}, {head_dim}], the reader expects "
                    f"[{self.num_layers}, {self.num_kv_heads}, {self.head_dim}]")  # fmt: skip
        if not all_finite(entry):
            return "it holds NaN or infinite values"
        return None


def all_finite(entry: KVEntry) -> bool:
    """Whether every floating-point tensor of `entry` (keys, values, scales) is finite: one float32
    sum per tensor and one device sync (once per entry object). A NaN or an infinity anywhere makes
    its sum non-finite; so do finite values too large to sum, which no model computes (an entry of
    them is refused as well)."""
    with _FINITE_LOCK:
        if entry in _FINITE:
            return True
    tensors = [t for t in (entry.keys, entry.values, *entry.extras.values()) if t.dtype.is_floating_point]
    sums = [t.float().sum() if t.element_size() == 1 else t.sum(dtype=torch.float32) for t in tensors]
    finite = not sums or bool(torch.isfinite(torch.stack(sums)).all())  # integer codes: scales are extras
    if finite:
        with _FINITE_LOCK:
            _FINITE.add(entry)
    return finite
