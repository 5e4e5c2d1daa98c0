"""A linear layer whose CPU weights can be laid out once for oneDNN's matrix multiply.

For the few rows of a decode step, oneDNN's multiply with a weight laid out once in its blocked
layout beats ``torch.nn.functional.linear`` on CPU. ``pack`` stores that copy of the weight
(``torch.ops.mkldnn._reorder_linear_weight``) and ``forward`` multiplies with it for inputs of at most ``PACKED_MAX_ROWS`` rows: on this project's 2-core AVX2 machine a
SmolLM2 decode step of one sequence ran about 20% faster and one of eight about 25% faster (medians
of interleaved runs); prefills keep ``F.linear``, which was as fast or faster there. The copy costs the
weights' size again in host memory; ``unpack`` frees it. Results are float32 products like
``F.linear``'s, summed in a different order (differences of about 1e-6 relative).

The packed copy is used only while it still matches the weight (same storage, no in-place update
since packing), so moving or reloading the weights falls back to ``F.linear`` until packed again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_REORDER = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
_PACKED_LINEAR = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
PACK_ROWS_HINT = 16  # oneDNN chooses the layout for about this many input rows (decode batches)
PACKED_MAX_ROWS = 64  # above this (prefills) F.linear was as fast or faster (about 9% at 512 rows)


def can_pack(weight: torch.Tensor) -> bool:
    """True when this torch build can pack ``weight``: float32 on CPU with oneDNN."""
    return (_REORDER is not None and _PACKED_LINEAR is not None and torch.backends.mkldnn.is_available()
            and weight.device.type == "cpu" and weight.dtype == torch.float32)  # fmt: skip


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) with an optional packed CPU weight."""

    _packed: tuple[torch.Tensor, int, int] | None = None  # (packed weight, data_ptr, version) at packing

    def pack(self) -> bool:
        """Lay the weight out for oneDNN; False (nothing changes) where that is not possible."""
        weight = self.weight.detach()
        if not can_pack(weight):
            self._packed = None
            return False
        self._packed = (_REORDER(weight, PACK_ROWS_HINT), weight.data_ptr(), weight._version)
        return True

    def unpack(self) -> None:
        self._packed = None

    @property
    def packed(self) -> bool:
        """The packed copy exists and still matches the weight."""
        packed = self._packed
        return packed is not None and packed[1:] == (self.weight.data_ptr(), self.weight._version)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] <= PACKED_MAX_ROWS and x.dtype == torch.float32 and x.device.type == "cpu" and self.packed:
            return _PACKED_LINEAR(x, self._packed[0], self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
