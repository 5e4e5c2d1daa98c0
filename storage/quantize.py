"""Quantized KV: packing an entry's keys and values into int8, fp8 or int4 with scales, and back.

A scheme quantizes keys per channel (one scale per layer, kv-head and channel over a group of the
entry's tokens: keys are stored before rotary, where a channel keeps its range across tokens) and
values per token (one scale per layer, kv-head and token over a group of channels). The scales are
the entry's `extras`, so they travel with it through every tier and sit inside the checksummed frame
on disk. A packed entry is what a quantized store holds everywhere (device, host, disk): the same
key always gives the same numbers, whichever tier served it; `kv_tensors` expands it on the device
that computes with it.

Groups: `ngroups` scales along an axis of length `n` cover index `i` with scale `i * ngroups // n`,
so the group layout is read from the shapes alone. int8 and fp8 are symmetric with one key scale
per channel over the whole entry and one value scale per token over the whole head; int4 is
asymmetric (a scale and a zero point) over groups of 32 tokens (keys) and 16 channels (values),
two values packed per byte along the channel axis (scheme `int4.2`; the first int4 layout, `int4`,
grouped values by 32 channels, a fifth more value error: it stays readable, under keys of its own).

Example:
    >>> import torch
    >>> from fusionrag_llm.storage.entry import KVEntry
    >>> kv = torch.randn(2, 1, 5, 8, generator=torch.Generator().manual_seed(0))
    >>> packed = pack(KVEntry((1, 2, 3, 4, 5), kv, kv.clone()), SCHEMES["int8"])
    >>> packed.dtype, sorted(packed.extras)
    (torch.int8, ['key_scales', 'value_scales'])
    >>> keys, values = kv_tensors(packed, "cpu", torch.float32)
    >>> bool((keys - kv).abs().max() < 0.05)
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .entry import KVEntry

SCALE_DTYPE = torch.float16  # per-token scales dominate the overhead; fp16 keeps them at 2 bytes


@dataclass(frozen=True)
class Scheme:
    """How one quantized codec packs entries. `key_group`/`value_group`: tokens per key scale and
    channels per value scale (0: the whole axis); `asymmetric`: a zero point beside each scale."""

    name: str
    dtype: torch.dtype  # of the packed keys and values
    levels: float  # largest magnitude (symmetric) or number of steps (asymmetric)
    key_group: int = 0
    value_group: int = 0
    asymmetric: bool = False
    packed_int4: bool = False

    @property
    def extra_names(self) -> tuple[str, ...]:
        zeros = ("key_zeros", "value_zeros") if self.asymmetric else ()
        return ("key_scales", "value_scales", *zeros)


SCHEMES = {
    "int8": Scheme("int8", torch.int8, 127.0),
    "fp8": Scheme("fp8", torch.float8_e4m3fn, 448.0),
    "int4": Scheme("int4", torch.uint8, 15.0, key_group=32, value_group=32, asymmetric=True, packed_int4=True),
    "int4.2": Scheme("int4.2", torch.uint8, 15.0, key_group=32, value_group=16, asymmetric=True, packed_int4=True),
}


def _groups(length: int, group: int) -> int:
    return 1 if group <= 0 else -(-length // group)


def _expand_index(length: int, ngroups: int, device: torch.device) -> torch.Tensor:
    """For each index along an axis of `length`, the group whose scale covers it."""
    return torch.arange(length, device=device) * ngroups // length


def _grouped(x: torch.Tensor, dim: int, ngroups: int, reduce) -> torch.Tensor:
    """`reduce` (amax or amin) of `x` over each group along `dim`, keeping `dim` with `ngroups` entries."""
    index = _expand_index(x.shape[dim], ngroups, x.device)
    shape = list(x.shape)
    shape[dim] = ngroups
    fill = -torch.inf if reduce == "amax" else torch.inf
    out = torch.full(shape, fill, dtype=x.dtype, device=x.device)
    view = [1] * x.dim()
    view[dim] = -1
    return out.scatter_reduce(dim, index.view(view).expand_as(x), x, reduce, include_self=True)


def _quantize(x: torch.Tensor, dim: int, ngroups: int, scheme: Scheme) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`x` (float32) quantized with scales (and zero points) per group along `dim`."""
    index = _expand_index(x.shape[dim], ngroups, x.device)
    if scheme.asymmetric:
        low, high = _grouped(x, dim, ngroups, "amin"), _grouped(x, dim, ngroups, "amax")
        zeros = low.to(SCALE_DTYPE)
        scales = ((high - zeros.float()) / scheme.levels).clamp_min(1e-4).to(SCALE_DTYPE)
        s, z = scales.float().index_select(dim, index), zeros.float().index_select(dim, index)
        q = ((x - z) / s).round_().clamp_(0, scheme.levels)
        return q.to(torch.uint8), {"scales": scales, "zeros": zeros}
    scales = (_grouped(x.abs(), dim, ngroups, "amax") / scheme.levels).clamp_min(1e-6).to(SCALE_DTYPE)
    q = x / scales.float().index_select(dim, index)
    if scheme.dtype == torch.int8:
        q = q.round_().clamp_(-scheme.levels, scheme.levels)
    else:
        q = q.clamp_(-scheme.levels, scheme.levels)
    return q.to(scheme.dtype), {"scales": scales}


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 along the last axis (even length) two per byte: low nibble first."""
    return q[..., 0::2] | (q[..., 1::2] << 4)


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).flatten(-2)


def pack(entry: KVEntry, scheme: Scheme) -> KVEntry:
    """`entry` (floating point, no extras) quantized by `scheme`, on its own device."""
    if entry.extras or not entry.dtype.is_floating_point:
        raise ValueError(f"only an unpacked floating-point entry can be quantized, got {entry.dtype} with "
                         f"extras {sorted(entry.extras)}")  # fmt: skip
    head_dim, tokens = entry.keys.shape[3], entry.keys.shape[2]
    if scheme.packed_int4 and head_dim % 2:
        raise ValueError(f"{scheme.name} packs two channels per byte and needs an even head_dim, got {head_dim}")
    keys, key_extra = _quantize(entry.keys.float(), 2, _groups(tokens, scheme.key_group), scheme)
    values, value_extra = _quantize(entry.values.float(), 3, _groups(head_dim, scheme.value_group), scheme)
    if scheme.packed_int4:
        keys, values = _pack_nibbles(keys), _pack_nibbles(values)
    extras = {f"key_{name}": t for name, t in key_extra.items()} | {f"value_{name}": t for name, t in value_extra.items()}
    return KVEntry(entry.token_ids, keys.contiguous(), values.contiguous(), dict(entry.meta), extras)


def scheme_of(entry: KVEntry, prefer: Scheme | None = None) -> Scheme | None:
    """The scheme `entry` is packed with (None: unpacked), `prefer` first when several layouts fit
    (small heads: int4's groups cover the whole head either way); `ValueError` when none fits."""
    if not entry.extras:
        return None
    problem = None
    for scheme in ([prefer] if prefer is not None else []) + list(SCHEMES.values()):
        if entry.dtype == scheme.dtype and set(entry.extras) == set(scheme.extra_names):
            try:
                check_packed(entry, scheme)
            except ValueError as exc:
                problem = problem or exc
                continue
            return scheme
    if problem is not None:
        raise problem
    raise ValueError(f"entry of dtype {entry.dtype} with extras {sorted(entry.extras)} matches no quantized "
                     f"scheme ({', '.join(SCHEMES)})")  # fmt: skip


def check_packed(entry: KVEntry, scheme: Scheme) -> None:
    """`ValueError` unless `entry` has the dtypes and shapes `scheme` packs to."""
    layers, heads, tokens, width = entry.keys.shape
    head_dim = 2 * width if scheme.packed_int4 else width
    if entry.dtype != scheme.dtype or set(entry.extras) != set(scheme.extra_names):
        raise ValueError(f"a {scheme.name} entry has {scheme.dtype} keys and extras {list(scheme.extra_names)}, "
                         f"got {entry.dtype} and {sorted(entry.extras)}")  # fmt: skip
    expected = {
        "key_scales": (layers, heads, _groups(tokens, scheme.key_group), head_dim),
        "value_scales": (layers, heads, tokens, _groups(head_dim, scheme.value_group)),
    }
    expected["key_zeros"], expected["value_zeros"] = expected["key_scales"], expected["value_scales"]
    for name in scheme.extra_names:
        tensor = entry.extras[name]
        if tuple(tensor.shape) != expected[name] or tensor.dtype != SCALE_DTYPE:
            raise ValueError(f"{scheme.name} extra {name!r} must be {SCALE_DTYPE} of shape {expected[name]}, "
                             f"got {tensor.dtype} of shape {tuple(tensor.shape)}")  # fmt: skip


def _dequantize(q: torch.Tensor, dim: int, scales: torch.Tensor, zeros: torch.Tensor | None) -> torch.Tensor:
    index = _expand_index(q.shape[dim], scales.shape[dim], q.device)
    out = q.float() * scales.float().index_select(dim, index)
    return out if zeros is None else out + zeros.float().index_select(dim, index)


def kv_tensors(entry: KVEntry, device: torch.device | str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`(keys, values)` of `entry` on `device` in `dtype`: moved as stored (packed when quantized, so
    the copy is the small one) and expanded there. An unpacked entry's tensors may be its own."""
    scheme = scheme_of(entry)
    if scheme is None:
        return entry.keys.to(device=device, dtype=dtype), entry.values.to(device=device, dtype=dtype)
    moved = entry.to(device)
    keys, values = moved.keys, moved.values
    if scheme.packed_int4:
        keys, values = _unpack_nibbles(keys), _unpack_nibbles(values)
    extras = moved.extras
    keys = _dequantize(keys, 2, extras["key_scales"], extras.get("key_zeros"))
    values = _dequantize(values, 3, extras["value_scales"], extras.get("value_zeros"))
    return keys.to(dtype), values.to(dtype)
