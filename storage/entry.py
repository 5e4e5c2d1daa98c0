"""`KVEntry`: the stored KV of one chunk (or one exact prefix path) for all layers."""

from __future__ import annotations

import copy
import json
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

_EXTRA_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")


def normalise_token_ids(token_ids: Any) -> tuple[int, ...]:
    """Return `token_ids` as a tuple of Python ints; `ValueError` for anything that is not an int."""
    if isinstance(token_ids, (str, bytes)):
        raise ValueError("token ids must be a sequence of ints, got a string")
    try:
        items = tuple(token_ids)
    except TypeError:
        raise ValueError(f"token ids must be a sequence of ints, got {type(token_ids).__name__}") from None
    if set(map(type, items)) <= {int}:  # plain ints (not bools, not int subclasses): as they are
        return items
    out = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError("token ids must be ints, got a bool")
        try:
            out.append(operator.index(item))
        except TypeError:
            raise ValueError(f"token ids must be ints, got {type(item).__name__} {item!r}") from None
    return tuple(out)


def _check_meta(meta: Any) -> dict:
    if not isinstance(meta, dict):
        raise ValueError(f"meta must be a dict, got {type(meta).__name__}")
    try:
        json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"meta must be JSON-serialisable (str keys, no NaN): {exc}") from None
    return meta


def _check_extras(extras: Any, keys: torch.Tensor) -> dict[str, torch.Tensor]:
    """Extras as a plain dict of named tensors on the device of `keys`; `ValueError` otherwise."""
    if not isinstance(extras, Mapping):
        raise ValueError(f"extras must be a mapping of name -> torch.Tensor, got {type(extras).__name__}")
    checked = {}
    for name, tensor in extras.items():
        if not isinstance(name, str) or not _EXTRA_NAME.match(name):
            raise ValueError(f"extra name {name!r} must match [a-z][a-z0-9_]{{0,31}} (e.g. 'key_scales')")
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"extra {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device != keys.device:
            raise ValueError(f"extra {name!r} is on {tensor.device} but keys are on {keys.device}; they must share it")
        checked[name] = tensor
    return checked


def same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality where `cuda` (no index) means the current CUDA device."""
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        current = torch.cuda.current_device() if a.type == "cuda" else 0
        return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
    return a.index == b.index


@dataclass(frozen=True, eq=False)
class KVEntry:
    """Keys and values of `len(token_ids)` tokens for every layer.

    `keys` are position-free (stored before rotary embedding); `keys` and `values` have the shape
    `[num_layers, num_kv_heads, T, head_dim]` with `T == len(token_ids)`, one dtype and one device.
    `meta` is a JSON-serialisable dict (variant, neighbour ids, ...). `extras` holds named tensors
    a codec's payload needs beside keys and values (e.g. `key_scales` of int8 keys), on the same
    device; they have their own dtypes and shapes, count in `nbytes` and travel with every copy.
    Entries with extras are never cast (`copy_to(dtype=...)` refuses): the codec that made them
    owns their dtype.

    Example:
        >>> import torch
        >>> kv = torch.zeros(2, 1, 3, 4)
        >>> KVEntry(token_ids=(5, 6, 7), keys=kv, values=kv.clone()).nbytes
        192
    """

    token_ids: tuple[int, ...]
    keys: torch.Tensor
    values: torch.Tensor
    meta: dict = field(default_factory=dict)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", normalise_token_ids(self.token_ids))
        _check_meta(self.meta)
        for name in ("keys", "values"):
            tensor = getattr(self, name)
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
            if tensor.dim() != 4:
                raise ValueError(
                    f"{name} must be 4-D [num_layers, num_kv_heads, T, head_dim], "
                    f"got shape {tuple(tensor.shape)}"
                )
        if self.keys.shape != self.values.shape:
            raise ValueError(
                f"keys and values must have the same shape, got {tuple(self.keys.shape)} "
                f"and {tuple(self.values.shape)}"
            )
        if self.keys.dtype != self.values.dtype or self.keys.device != self.values.device:
            raise ValueError(
                f"keys and values must share dtype and device, got {self.keys.dtype}/{self.keys.device} "
                f"and {self.values.dtype}/{self.values.device}"
            )
        if self.keys.shape[2] != len(self.token_ids) or not self.token_ids:
            raise ValueError(
                f"keys/values have T={self.keys.shape[2]} tokens on dim 2 but token_ids has "
                f"{len(self.token_ids)}; they must be equal and at least 1"
            )
        object.__setattr__(self, "extras", _check_extras(self.extras, self.keys))

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def dtype(self) -> torch.dtype:
        return self.keys.dtype

    @property
    def device(self) -> torch.device:
        return self.keys.device

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value tensors and the extras."""
        extra = sum(t.numel() * t.element_size() for t in self.extras.values())
        return 2 * self.keys.numel() * self.keys.element_size() + extra

    def copy_to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> KVEntry:
        """A copy in fresh, contiguous storage (never aliases `self`), optionally moved and cast."""
        device = self.device if device is None else torch.device(device)
        dtype = self.dtype if dtype is None else dtype
        if self.extras and dtype != self.dtype:
            raise ValueError(
                f"an entry with extras ({', '.join(self.extras)}) keeps the dtype its codec gave it "
                f"({self.dtype}); casting it to {dtype} is not allowed (use a store without storage_dtype)"
            )
        keys, values = _fresh(self.keys, dtype, device), _fresh(self.values, dtype, device)
        extras = {name: _fresh(t, t.dtype, device) for name, t in self.extras.items()}
        return KVEntry(self.token_ids, keys, values, copy.deepcopy(self.meta), extras)

    def to(self, device: torch.device | str) -> KVEntry:
        """`self` when already on `device`, else a copy there."""
        if same_device(self.device, torch.device(device)):
            return self
        return self.copy_to(device)

    def bitwise_equal(self, other: KVEntry) -> bool:
        """True when token ids, meta, dtype, shape, extras and every tensor bit are equal."""
        if (self.token_ids, self.meta, self.dtype, self.keys.shape) != (
            other.token_ids,
            other.meta,
            other.dtype,
            other.keys.shape,
        ):
            return False
        if set(self.extras) != set(other.extras):
            return False
        mine = [self.keys, self.values, *(self.extras[n] for n in sorted(self.extras))]
        theirs = [other.keys, other.values, *(other.extras[n] for n in sorted(self.extras))]
        return all(_same_bits(a, b) for a, b in zip(mine, theirs))


def _fresh(tensor: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A copy of `tensor` in new, contiguous storage (never a view of it)."""
    out = torch.empty(tensor.shape, dtype=dtype, device=device)
    out.copy_(tensor)
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.dim() == 0:
        a, b = a.reshape(1), b.reshape(1)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
