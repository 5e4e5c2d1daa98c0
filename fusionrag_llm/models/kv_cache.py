"""A request's own KV buffer: rotated keys and values per layer, addressed by slot.

Slots are storage places; what a token *is* to attention is its absolute position (``positions``)
and whether its KV may be read (``valid``). A query at position p sees every valid slot whose
position is <= p, wherever that slot lies in the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionScaling:
    """APE's rescaled attention: computed queries see the ``slots`` marked True with logits divided by
    ``temperature`` and softmax weights multiplied by ``scale`` (then renormalised over all keys)."""

    slots: torch.Tensor  # [capacity] bool
    temperature: float
    scale: float


@dataclass
class KVCache:
    keys: torch.Tensor  # [num_layers, num_kv_heads, capacity, head_dim], rotary applied
    values: torch.Tensor  # [num_layers, num_kv_heads, capacity, head_dim]
    positions: torch.Tensor  # [capacity] int64 absolute positions
    valid: torch.Tensor  # [capacity] bool
    groups: torch.Tensor  # [capacity] int32; group 0 is seen by all, others only by their own group
    length: int = 0  # slots [0, length) are in use
    scaling: AttentionScaling | None = None  # None: plain softmax attention
    # A lower-precision copy of keys/values that decode steps read (``DecoderLM.decode_kv``); it exists
    # only while it equals the full-precision cache rounded, and any other write drops it.
    decode_keys: torch.Tensor | None = None
    decode_values: torch.Tensor | None = None

    @classmethod
    def empty(
        cls,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> "KVCache":
        shape = (num_layers, num_kv_heads, capacity, head_dim)
        return cls(
            keys=torch.zeros(shape, dtype=dtype, device=device),
            values=torch.zeros(shape, dtype=dtype, device=device),
            positions=torch.zeros(capacity, dtype=torch.long, device=device),
            valid=torch.zeros(capacity, dtype=torch.bool, device=device),
            groups=torch.zeros(capacity, dtype=torch.int32, device=device),
        )

    def mirror(self, dtype: torch.dtype) -> None:
        """Make (once) the ``dtype`` copy of keys and values that decode steps read."""
        if self.decode_keys is None or self.decode_keys.dtype != dtype:
            self.decode_keys, self.decode_values = self.keys.to(dtype), self.values.to(dtype)

    def drop_mirror(self) -> None:
        self.decode_keys = self.decode_values = None

    def fork(self) -> "KVCache":
        """An independent copy (its own buffers; the decode mirror is not copied), e.g. for a second
        answer to the same prompt."""
        return KVCache(self.keys.clone(), self.values.clone(), self.positions.clone(), self.valid.clone(),
                       self.groups.clone(), self.length, self.scaling)  # fmt: skip

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def reserve(self, count: int) -> torch.Tensor:
        """Take the next ``count`` free slots; returns their indices."""
        if self.length + count > self.capacity:
            raise ValueError(f"KV cache full: {self.length} + {count} slots exceed capacity {self.capacity}")
        slots = torch.arange(self.length, self.length + count, device=self.keys.device)
        self.length += count
        return slots

    def attention_mask(self, query_positions: torch.Tensor, query_groups: torch.Tensor | None = None) -> torch.Tensor:
        """[n, length] bool: which used slots each query may attend to (causal by position).

        With ``query_groups``, a query also sees only group-0 slots and slots of its own group, so
        several independent sequences after a shared prefix can run in one pass.
        """
        positions = self.positions[: self.length]
        mask = self.valid[: self.length][None, :] & (positions[None, :] <= query_positions[:, None])
        if query_groups is not None:
            groups = self.groups[: self.length][None, :]
            mask &= (groups == 0) | (groups == query_groups[:, None])
        return mask
