"""Rotary position embedding of position-free keys (or queries) at arbitrary absolute positions.

Half-rotation convention (transformers' ``rotate_half``), bit-compatible with transformers' Llama:

    freqs = positions[:, None].float() * inv_freq[None]          # [N, D/2] fp32
    emb = cat(freqs, freqs)                                      # [N, D]
    cos, sin = cos(emb).to(x.dtype), sin(emb).to(x.dtype)
    out = x * cos + rotate_half(x) * sin                         # each op rounded to x.dtype

The kernel computes in fp32 and rounds after every product and after the sum exactly as torch's
low-precision elementwise ops do, so bf16/fp16 results match the reference up to the last-ulp
differences of the device's cos/sin implementation.
"""

from __future__ import annotations

import torch

from . import cpu_quant
from ._common import (FLOAT_DTYPES, check, check_devices, check_tensor, interpreting, require_triton,
                      tl, triton)

_OP = "apply_rotary"

if triton is not None:

    @triton.jit
    def _round(x, DTYPE: tl.constexpr):
        """Round fp32 ``x`` to DTYPE and back, mimicking one torch op in that dtype."""
        return x.to(DTYPE).to(tl.float32)

    @triton.jit
    def _rotary_kernel(X, POS, INV_FREQ, OUT, SLOTS, n_tokens, stride_xh, stride_xn, stride_oh, stride_on,
                       HALF: tl.constexpr, HALF_P2: tl.constexpr, BLOCK_N: tl.constexpr, HAS_SLOTS: tl.constexpr):
        """Grid (token blocks, heads); each program rotates [BLOCK_N, D] of one head, into OUT's rows
        0..N-1, or with HAS_SLOTS into its rows SLOTS[0..N-1]."""
        head = tl.program_id(1).to(tl.int64)
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_h = tl.arange(0, HALF_P2)
        mask = (offs_n < n_tokens)[:, None] & (offs_h < HALF)[None, :]
        pos = tl.load(POS + offs_n, mask=offs_n < n_tokens, other=0).to(tl.float32)
        inv = tl.load(INV_FREQ + offs_h, mask=offs_h < HALF, other=0.0)
        freqs = pos[:, None] * inv[None, :]  # [BLOCK_N, HALF_P2] fp32, same product as torch
        dt = OUT.dtype.element_ty
        cos = _round(tl.cos(freqs), dt)
        sin = _round(tl.sin(freqs), dt)
        x_ptr = X + head * stride_xh + offs_n[:, None] * stride_xn + offs_h[None, :]
        x1 = tl.load(x_ptr, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + HALF, mask=mask, other=0.0).to(tl.float32)
        # rotate_half(x) = cat(-x2, x1): out1 = x1*cos - x2*sin, out2 = x2*cos + x1*sin
        out1 = _round(x1 * cos, dt) - _round(x2 * sin, dt)
        out2 = _round(x2 * cos, dt) + _round(x1 * sin, dt)
        rows = offs_n
        if HAS_SLOTS:
            rows = tl.load(SLOTS + offs_n, mask=offs_n < n_tokens, other=0)
        o_ptr = OUT + head * stride_oh + rows[:, None].to(tl.int64) * stride_on + offs_h[None, :]
        tl.store(o_ptr, out1.to(dt), mask=mask)
        tl.store(o_ptr + HALF, out2.to(dt), mask=mask)


def _check_inputs(op, x, positions, inv_freq):
    check_tensor(x, op, "x [H, N, D]", 3, FLOAT_DTYPES)
    check_tensor(positions, op, "positions [N]", 1, (torch.int64, torch.int32))
    check_tensor(inv_freq, op, "inv_freq [D/2]", 1, (torch.float32,))
    h, n, d = x.shape
    check(d % 2 == 0 and d > 0, op, f"head dim {d} must be even")
    check(positions.shape[0] == n, op, f"positions has {positions.shape[0]} entries, x has {n} tokens")
    check(inv_freq.shape[0] == d // 2, op,
          f"inv_freq has {inv_freq.shape[0]} entries, expected D/2 = {d // 2}")


def apply_rotary(x, positions, inv_freq, out=None, slots=None):
    """Triton rotary embedding: x [H, N, D], positions [N] int64, inv_freq [D/2] fp32 -> [H, N, D].

    Returns a new contiguous tensor in x's dtype; or, given ``out`` [H, C, D] (x's dtype and device) and
    ``slots`` [N] int64, writes ``out[:, slots] = rotated`` without a tensor in between (a stored entry's
    keys placed into a cache) and returns ``out``. CUDA tensors (CPU under ``TRITON_INTERPRET=1``); x and
    out must be contiguous in their last dimension. Any even head dim works. Slots are not checked
    against C (the caller's own: a cache's reserved slots).

    >>> k_rot = apply_rotary(k_stored, torch.arange(100, 164), inv_freq)  # doctest: +SKIP
    """
    require_triton(_OP)
    _check_inputs(_OP, x, positions, inv_freq)
    check_devices(_OP, x=x, positions=positions, inv_freq=inv_freq)
    check(x.shape[-1] <= 1 or x.stride(-1) == 1, _OP,
          f"x must be contiguous in its last dimension (stride {x.stride(-1)}); call .contiguous()")
    h, n, d = x.shape
    if (out is None) != (slots is None):
        raise ValueError(f"{_OP}: out and slots go together (both or neither)")
    if out is None:
        out = torch.empty((h, n, d), dtype=x.dtype, device=x.device)
    else:
        check_tensor(slots, _OP, "slots [N]", 1, (torch.int64, torch.int32))
        check_devices(_OP, x=x, out=out, slots=slots)
        check(out.dim() == 3 and out.shape[0] == h and out.shape[2] == d and out.dtype == x.dtype, _OP,
              f"out must be [H={h}, C, D={d}] in {x.dtype}, got {list(out.shape)} in {out.dtype}")
        check(slots.shape[0] == n, _OP, f"slots has {slots.shape[0]} entries, x has {n} tokens")
        check(out.stride(-1) == 1, _OP, f"out must be contiguous in its last dimension (stride {out.stride(-1)})")
    if h == 0 or n == 0:
        return out
    half = d // 2
    block_n = 16 if interpreting() else max(1, min(64, 4096 // triton.next_power_of_2(d)))
    grid = (triton.cdiv(n, block_n), h)
    into = slots is not None
    _rotary_kernel[grid](x, positions.contiguous(), inv_freq.contiguous(), out, slots.contiguous() if into else positions,
                         n, x.stride(0), x.stride(1), out.stride(0), out.stride(1), HALF=half,
                         HALF_P2=triton.next_power_of_2(half), BLOCK_N=block_n, HAS_SLOTS=into)  # fmt: skip
    return out


def rotary_cos_sin(positions, inv_freq, dtype):
    """cos, sin ``[N, D]`` in ``dtype`` for ``positions`` [N] (fp32 angles, as transformers' Llama)."""
    freqs = positions.to(inv_freq.device).float()[:, None] * inv_freq[None, :]  # [N, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate(x, cos, sin):
    """``x`` [..., N, D] rotated by precomputed cos/sin [N, D]: ``x * cos + rotate_half(x) * sin``."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def rotate_cpu(x, cos, sin, out=None, slots=None):
    """``rotate(x, cos, sin)`` for float32 ``x`` [..., N, D] on the CPU in one compiled pass
    (``fr_rotate_rows``, the same bits): into a new tensor, or with ``out`` [..., C, D] (``x``'s leading
    dims) and ``slots`` [N] written into ``out[..., slots, :]``. None where the compiled kernel does not
    take it (another device or dtype, rows not contiguous, no compiler): the caller uses ``rotate``.
    Slots outside ``[0, C)`` raise ``IndexError``, as indexing would."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() < 2 or x.shape[-1] % 2 or x.stride(-1) != 1:
        return None
    n, d = x.shape[-2:]
    if cos.shape != (n, d) or sin.shape != (n, d) or cos.dtype != torch.float32 or sin.dtype != torch.float32:
        return None
    if out is not None and (out.dtype != torch.float32 or out.device.type != "cpu" or out.shape[:-2] != x.shape[:-2]
                            or out.shape[-1] != d or out.stride(-1) != 1):  # fmt: skip
        return None
    lib = cpu_quant.native_library()
    if lib is None:
        return None
    made = out is None
    if made:
        out, slots = torch.empty(x.shape, dtype=x.dtype), None
    try:  # one batch dimension for the leading ones, where their strides allow it without a copy
        rows, target = x.view(-1, n, d), out.view(-1, *out.shape[-2:])
    except RuntimeError:
        return None
    if slots is not None:
        slots = slots.to(device="cpu", dtype=torch.int64).contiguous()
        if slots.shape != (n,):
            raise ValueError(f"rotate_cpu: {slots.shape[0] if slots.dim() else 0} slots for {n} rows")
        if n and (int(slots.min()) < 0 or int(slots.max()) >= target.shape[1]):
            raise IndexError(f"rotate_cpu: slots outside [0, {target.shape[1]})")
    if not rows.numel():
        return out
    cos, sin = cos.contiguous(), sin.contiguous()
    lib.fr_rotate_rows(rows.data_ptr(), rows.stride(0), rows.stride(1), rows.shape[0], n, d, cos.data_ptr(),
                       sin.data_ptr(), target.data_ptr(), target.stride(0), target.stride(1),
                       None if slots is None else slots.data_ptr())  # fmt: skip
    return out


def apply_rotary_ref(x, positions, inv_freq, out=None, slots=None):
    """Pure-torch reference of :func:`apply_rotary` (transformers' Llama arithmetic, any device)."""
    _check_inputs(_OP + "_ref", x, positions, inv_freq)
    cos, sin = rotary_cos_sin(positions, inv_freq, x.dtype)
    rotated = rotate(x, cos.to(x.device), sin.to(x.device))
    if out is None:
        return rotated
    out[:, slots] = rotated
    return out
