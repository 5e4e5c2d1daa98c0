"""A linear layer whose CPU weights can be laid out once for oneDNN's matrix multiply.

For the few rows of a decode step, oneDNN's multiply with a weight laid out once in its blocked
layout beats ``torch.nn.functional.linear`` on CPU. ``pack`` stores that copy of the weight
(``torch.ops.mkldnn._reorder_linear_weight``) and ``forward`` multiplies with it for inputs of at most
``packed_max_rows()`` rows: on this project's 2-core AVX2 machine a SmolLM2 decode step of one
sequence ran about 20% faster and one of eight about 25% faster (medians of interleaved runs), while
prefills (over ``PACKED_MAX_ROWS`` rows) were as fast or faster with ``F.linear``, which is MKL's
multiply. MKL does not take its fastest path on other vendors' processors: on a 2-core AMD EPYC
(AVX-512) the packed multiply was faster at every size, 1.65x at 64 rows, 1.33x at 512, 1.15x at
6,239 (SmolLM2's seven layer shapes), so there it serves every row count. The copy costs the
weights' size again in host memory; ``unpack`` frees it. Results are float32 products like
``F.linear``'s, summed in a different order (differences of about 1e-6 relative).

The packed copy is used only while it still matches the weight (same storage, no in-place update
since packing), so moving or reloading the weights falls back to ``F.linear`` until packed again.

Decode steps can also read a block-quantized copy (``quantize``: GGUF's 8-bit Q8_0 or 4-bit Q4_1
blocks, ``kernels/cpu_quant.py``), only inside ``quantized_linears(True)``: the model turns it on
for a forward made of decode steps alone, so prefills, and every KV entry they store, stay float.
"""

from __future__ import annotations

import contextvars
import functools
import platform
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fusionrag_llm.kernels import cpu_quant

_REORDER = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
_PACKED_LINEAR = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
PACK_ROWS_HINT = 16  # oneDNN chooses the layout for about this many input rows (decode batches)
PACKED_MAX_ROWS = 64  # above this (prefills) F.linear was as fast or faster (about 9% at 512 rows)
_QUANTIZED = contextvars.ContextVar("fusionrag_quantized_linears", default=False)


@functools.cache
def packed_max_rows() -> float:
    """Input rows up to which a packed weight is used: every count on an x86 processor that is not
    Intel's (where F.linear's MKL multiply is slower at every size), else ``PACKED_MAX_ROWS``."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return PACKED_MAX_ROWS
    return PACKED_MAX_ROWS if cpu_vendor() in ("GenuineIntel", "") else float("inf")


def cpu_vendor() -> str:
    """The processor's vendor string (``GenuineIntel``, ``AuthenticAMD``, ...) where Linux says it, else ""."""
    try:
        with Path("/proc/cpuinfo").open() as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@contextmanager
def quantized_linears(on: bool):
    """Within the block, linear layers with a quantized copy multiply with it (when ``on``)."""
    token = _QUANTIZED.set(on)
    try:
        yield
    finally:
        _QUANTIZED.reset(token)


def can_pack(weight: torch.Tensor) -> bool:
    """True when this torch build can pack ``weight``: float32 on CPU with oneDNN."""
    return (_REORDER is not None and _PACKED_LINEAR is not None and torch.backends.mkldnn.is_available()
            and weight.device.type == "cpu" and weight.dtype == torch.float32)  # fmt: skip


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) with an optional packed CPU weight."""

    _packed: tuple[torch.Tensor, int, int] | None = None  # (packed weight, data_ptr, version) at packing
    _quant: tuple[cpu_quant.QuantWeight, int, int] | None = None  # (blocks, data_ptr, version) at quantizing

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

    def quantize(self, fmt: str | None) -> bool:
        """Keep a ``fmt`` ("q8", "q4") copy of the weight for decode steps, or drop it (None); "exact":
        the 4-bit or 8-bit form only if it holds the weight's own numbers. False (nothing kept) for a
        weight the kernel cannot take (not on CPU, inputs not a multiple of 32, values beyond the
        half-float range of the block scales) or not exact."""
        weight = self.weight.detach()
        self._quant = None
        if fmt is None or weight.device.type != "cpu" or weight.shape[1] % cpu_quant.BLOCK:
            return False
        try:
            quant = cpu_quant.quantize_exact(weight) if fmt == "exact" else cpu_quant.quantize(weight, fmt)
        except ValueError:  # out of the scales' range: this layer decodes from its float weight
            return False
        if quant is not None:
            quant = cpu_quant.tile(quant) if cpu_quant.can_tile(quant) else quant
            self._quant = (quant, weight.data_ptr(), weight._version)
        return quant is not None

    @property
    def quantized(self) -> str | None:
        """The format of the quantized copy while it still matches the weight, else None."""
        quant = self._quant
        if quant is None or quant[1:] != (self.weight.data_ptr(), self.weight._version):
            return None
        return quant[0].fmt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _QUANTIZED.get() and x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu" and self.quantized:
            y = cpu_quant.run_linear(x.contiguous(), self._quant[0])
            return y if self.bias is None else y + self.bias
        if x.dim() == 2 and x.shape[0] <= packed_max_rows() and x.dtype == torch.float32 and x.device.type == "cpu" and self.packed:
            return _PACKED_LINEAR(x, self._packed[0], self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class FusedLinears:
    """Linear layers that read the same input (q/k/v, gate/up), run as one kernel call.

    ``fuse()`` concatenates their quantized copies into one weight and leaves each layer a view of
    its rows (no second copy). While quantized linears are on and every layer still holds those
    rows, ``__call__`` makes one call for all of them. ``fuse_float()`` does the same with the float
    weights themselves, for every forward (on a GPU each matrix multiply is a kernel launch: a decode
    step of a 32-layer model makes 96 fewer). Otherwise it calls each layer.
    """

    def __init__(self, *linears: Linear):
        self.linears = linears
        self.sizes = [linear.out_features for linear in linears]
        self._fused: tuple[cpu_quant.QuantWeight, torch.Tensor | None, tuple[cpu_quant.QuantWeight, ...]] | None = None
        # (the fused weight, its bias or None, the data pointers of the layers' weights and biases at fusing)
        self._float: tuple[torch.Tensor, torch.Tensor | None, tuple[int, ...]] | None = None

    def fuse_float(self) -> bool:
        """Put the layers' float weights (and biases) into one tensor whose rows each layer's parameter
        views (the same numbers, no second copy); False where their dtype, device or input size differ."""
        self._float = None
        weights = [linear.weight for linear in self.linears]
        if len({(w.dtype, w.device, w.shape[1]) for w in weights}) != 1:
            return False
        fused = torch.cat([w.detach() for w in weights])
        biases = [linear.bias for linear in self.linears]
        bias = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else fused.new_zeros(n) for b, n in zip(biases, self.sizes)])  # fmt: skip
        start = 0
        for linear, size in zip(self.linears, self.sizes):
            linear.weight = nn.Parameter(fused[start : start + size], requires_grad=False)
            if bias is not None and linear.bias is not None:
                linear.bias = nn.Parameter(bias[start : start + size], requires_grad=False)
            start += size
        self._float = (fused, bias, self._pointers())
        return True

    def _pointers(self) -> tuple[int, ...]:
        """Where the layers' weights and biases live now: moved, replaced or reloaded elsewhere, they differ."""
        return tuple(t.data_ptr() if t is not None else 0 for linear in self.linears for t in (linear.weight, linear.bias))

    def fuse(self) -> bool:
        """Join the layers' quantized copies when all have one, in one format; False otherwise."""
        self._fused = None
        quants = [linear._quant[0] if linear.quantized else None for linear in self.linears]
        if any(q is None for q in quants) or len({q.fmt for q in quants}) != 1:
            return False
        fused = cpu_quant.concat_rows(quants)
        start = 0
        for linear, quant in zip(self.linears, quants):
            linear._quant = (cpu_quant.row_slice(fused, start, quant.shape[0]), *linear._quant[1:])
            start += quant.shape[0]
        biases = [linear.bias for linear in self.linears]
        bias = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else torch.zeros(n) for b, n in zip(biases, self.sizes)])  # fmt: skip
        self._fused = (fused, bias, tuple(linear._quant[0] for linear in self.linears))
        return True

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        fused = self._fused
        if (fused is not None and _QUANTIZED.get() and x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu"
                and all(linear.quantized and linear._quant[0] is part for linear, part in zip(self.linears, fused[2]))):  # fmt: skip
            y = cpu_quant.run_linear(x.contiguous(), fused[0])
            if fused[1] is not None:
                y = y + fused[1]
            return list(y.split(self.sizes, dim=-1))
        whole = self._float
        if whole is not None and self._pointers() == whole[2]:  # every layer still views the fused rows
            return list(F.linear(x, whole[0], whole[1]).split(self.sizes, dim=-1))
        return [linear(x) for linear in self.linears]
