"""A prefill's attention on the CPU in one compiled call: every query over a prefix of the cache.

Where a cache's slot j holds position j, or a causal block ends the cache after slots its queries all
see, query i sees exactly the slots ``[0, limits[i])``: a whole prompt's prefill, a chunk's entry after
its neighbours, a question after reused chunks, the position-sorted sparse recompute of a request.
``attend_prefix_cpu`` attends all of them at once through ``fr_attend_prefix`` (``cpu_kernels.c``):
each key/value head's keys transposed once, then blocks of its query heads' rows over chunks of 64
keys with an online softmax (flash attention), the scores of a chunk kept in registers and masked only
in the chunks a query's limit falls into. PyTorch's CPU flash kernel multiplies through the BLAS, whose
small products (d = 64 here) ran at 54-90 GFLOP/s on the AMD processor it was measured on; this
kernel's whole attention ran at ~165 GFLOP/s there against PyTorch's 90-115 (docs/cpu.md). The result
matches a float64 softmax to float32 rounding, as PyTorch's does; the order of the sums differs, so the
last bits do. Each query's numbers depend on its own keys only, never on the rows or threads beside it.
"""

from __future__ import annotations

import torch

from . import cpu_quant


def attend_prefix_cpu(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      limits: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
    """q [heads, n, d] over keys/values [kv_heads, L, d], query i seeing keys ``[0, limits[i])``: [heads, n, d]
    (token-major underneath, so [n, heads * d] rows are a view). None where the compiled kernel does not
    take it (not the CPU, not float32, a head_dim that is not a multiple of 64 up to 256, a layout with
    rows that are not contiguous, no compiler or no AVX-512): the caller uses PyTorch's attention."""
    if q.device.type != "cpu" or q.dtype != torch.float32 or keys.dtype != torch.float32 or values.dtype != torch.float32:
        return None
    heads, n, d = q.shape
    kv_heads, length, _ = keys.shape
    if (d % 64 or d > 256 or heads % kv_heads or values.shape != keys.shape or q.stride(2) != 1
            or keys.stride()[1:] != (d, 1) or values.stride() != keys.stride()):  # fmt: skip
        return None
    if limits.shape != (n,) or limits.dtype != torch.int64:
        raise ValueError(f"attend_prefix_cpu: limits must be int64 [{n}], got {limits.dtype} {tuple(limits.shape)}")
    limits = limits.contiguous()
    if n and (int(limits.min()) < 0 or int(limits.max()) > length):
        raise ValueError(f"attend_prefix_cpu: limits outside [0, {length}]")
    lib = cpu_quant.native_library()
    if lib is None:
        return None
    out = torch.empty((n, heads, d), dtype=torch.float32).transpose(0, 1)
    status = lib.fr_attend_prefix(q.data_ptr(), q.stride(0), q.stride(1), keys.data_ptr(), values.data_ptr(),
                                  keys.stride(0), limits.data_ptr(), n, heads, kv_heads, d, out.data_ptr(),
                                  out.stride(0), out.stride(1))  # fmt: skip
    if status == 2:
        return None
    if status:
        raise MemoryError(f"attend_prefix_cpu: no memory for the transposed keys of {kv_heads} x {length} x {d}")
    return out
