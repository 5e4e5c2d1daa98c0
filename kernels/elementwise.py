"""The decoder layer's elementwise steps as one kernel each: RMSNorm (after a residual add, or alone) and
SwiGLU's ``silu(gate) * up``.

In torch, a bf16 RMSNorm is eight kernels (a cast, the square, the mean, the epsilon, the reciprocal
root, the product, a cast back, the weight) and SwiGLU two: half of the ~1,000 launches of one decode
step of a 32-layer model, each reading and writing the whole activation again. Here each is one
program per row that reads its input once and writes its output once.

Both round where torch's ops round, so results match the references up to the order of the sum of
squares (RMSNorm) and the device's ``exp``:

    rms_norm:  y = (x.float() * rsqrt(mean(x.float()**2) + eps)).to(x.dtype);  out = weight * y
    silu_mul:  s = silu(gate) rounded to gate's dtype;                         out = s * up
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import FLOAT_DTYPES, check, check_devices, interpreting, require_triton, tl, triton

MAX_ROW = 32768  # the widest row one program holds (hidden sizes of today's models are <= 16k)

if triton is not None:

    @triton.jit
    def _rms_norm_kernel(X, D, S, W, OUT, n_cols, stride_x, stride_d, stride_s, stride_o, eps,
                         HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
        """One program per row: the row's mean square, then each element scaled and weighted. With
        ``HAS_DELTA`` the row is first ``x + delta`` (rounded as torch's add), written to S and normed."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
        if HAS_DELTA:
            delta = tl.load(D + row * stride_d + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + delta.to(tl.float32)).to(X.dtype.element_ty)
            tl.store(S + row * stride_s + cols, x, mask=mask)
        x = x.to(tl.float32)
        inverse = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        y = (x * inverse).to(X.dtype.element_ty).to(tl.float32)  # torch casts back before the weight
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(OUT + row * stride_o + cols, (w * y).to(OUT.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_mul_kernel(G, U, OUT, n_cols, stride_g, stride_u, stride_o, BLOCK: tl.constexpr):
        """Grid (rows, column blocks): ``silu(gate) * up`` for BLOCK columns of one row."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(U + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(G.dtype.element_ty).to(tl.float32)  # torch's silu, rounded
        tl.store(OUT + row * stride_o + cols, (s * u).to(OUT.dtype.element_ty), mask=mask)


def _rows(op: str, name: str, t, size: int) -> torch.Tensor:
    """``t`` as [rows, size] with unit stride along the row (a copy only where no view exists)."""
    check(isinstance(t, torch.Tensor), op, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check(t.dtype in FLOAT_DTYPES, op, f"{name} has dtype {t.dtype}; allowed: float16, bfloat16, float32")
    check(t.dim() >= 1 and t.shape[-1] == size, op, f"{name} must end in a dimension of {size}, got shape {tuple(t.shape)}")
    flat = t.reshape(-1, size) if t.dim() != 2 else t
    return flat if size <= 1 or flat.stride(-1) == 1 else flat.contiguous()


def _check_norm(op: str, x, weight) -> None:
    check(isinstance(weight, torch.Tensor) and weight.dim() == 1, op,
          f"weight must be a 1-D tensor, got {getattr(weight, 'shape', type(weight).__name__)}")  # fmt: skip
    check(weight.dtype in FLOAT_DTYPES, op, f"weight has dtype {weight.dtype}; allowed: float16, bfloat16, float32")
    check(isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[-1] == weight.shape[0], op,
          f"x must end in weight's size {weight.shape[0]}, got shape {tuple(getattr(x, 'shape', ()))}")  # fmt: skip


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Triton RMSNorm of ``x`` [..., hidden] with ``weight`` [hidden]; the output has x's shape and the
    dtype torch gives ``weight * x`` (x's where both share one). CUDA tensors (CPU under
    ``TRITON_INTERPRET=1``); rows of up to ``MAX_ROW`` elements.

    >>> out = rms_norm(hidden_states, layer.input_layernorm.weight, 1e-5)  # doctest: +SKIP
    """
    return _launch_norm("rms_norm", x, None, weight, eps)[1]


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + delta, rms_norm(x + delta))`` in one pass: a decoder layer's residual add and the norm after
    it (``x`` and ``delta`` of one shape and dtype; the sum in their dtype, as torch's add gives it).

    >>> h, normed = add_rms_norm(x, attention_out, layer.post_attention_layernorm.weight, 1e-5)  # doctest: +SKIP
    """
    op = "add_rms_norm"
    _check_pair(op, x, delta, ("x", "delta"))
    return _launch_norm(op, x, delta, weight, eps)


def _launch_norm(op: str, x, delta, weight, eps: float) -> tuple[torch.Tensor | None, torch.Tensor]:
    require_triton(op)
    _check_norm(op, x, weight)
    size = weight.shape[0]
    check(0 < size <= MAX_ROW, op, f"rows of {size} elements are not supported; allowed: 1 to {MAX_ROW}")
    check_devices(op, x=x, delta=delta, weight=weight)
    flat = _rows(op, "x", x, size)
    rows = flat if delta is None else _rows(op, "delta", delta, size)
    out = torch.empty(flat.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    total = None if delta is None else torch.empty(flat.shape, dtype=x.dtype, device=x.device)
    if flat.shape[0]:
        block = triton.next_power_of_2(size)
        warps = 1 if interpreting() else min(16, max(1, block // 512))
        sums = out if total is None else total  # not written without a delta
        _rms_norm_kernel[(flat.shape[0],)](flat, rows, sums, weight.contiguous(), out, size, flat.stride(0),
                                           rows.stride(0), sums.stride(0), out.stride(0), float(eps),
                                           HAS_DELTA=delta is not None, BLOCK=block, num_warps=warps)  # fmt: skip
    return None if total is None else total.view(x.shape), out.view(x.shape)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The torch RMSNorm (transformers' Llama arithmetic, any device; no checks: the model's own path)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def add_rms_norm_ref(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch residual add and RMSNorm (no checks: the model's own path)."""
    total = x + delta
    return total, rms_norm_ref(total, weight, eps)


def _check_pair(op: str, a, b, names: tuple[str, str] = ("gate", "up")) -> None:
    for name, t in zip(names, (a, b)):
        check(isinstance(t, torch.Tensor), op, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    pair = " and ".join(names)
    check(a.shape == b.shape, op, f"{pair} must have one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    check(a.dtype == b.dtype, op, f"{pair} must have one dtype, got {a.dtype} and {b.dtype}")


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Triton ``silu(gate) * up`` (SwiGLU) of two tensors of one shape [..., n] (views of one fused
    projection's output are fine: rows may have any stride). CUDA tensors (CPU under
    ``TRITON_INTERPRET=1``); returns a new contiguous tensor.

    >>> hidden = silu_mul(gate, up)  # doctest: +SKIP
    """
    op = "silu_mul"
    require_triton(op)
    _check_pair(op, gate, up)
    check(gate.dim() >= 1, op, "gate and up must have at least one dimension")
    check_devices(op, gate=gate, up=up)
    size = gate.shape[-1]
    g, u = _rows(op, "gate", gate, size), _rows(op, "up", up, size)
    out = torch.empty(g.shape, dtype=gate.dtype, device=gate.device)
    if g.numel():
        block = min(1024, triton.next_power_of_2(size))
        _silu_mul_kernel[(g.shape[0], triton.cdiv(size, block))](g, u, out, size, g.stride(0), u.stride(0),
                                                                  out.stride(0), BLOCK=block)  # fmt: skip
    return out.view(gate.shape)


def silu_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The torch ``F.silu(gate) * up`` (no checks: the model's own path)."""
    return F.silu(gate) * up
