"""Batched Q-sparse attention: several requests packed along the token dimension.

Layout (flash-attn ``cu_seqlens`` style; B requests, offsets are int32 or int64 of shape [B + 1],
starting at 0, non-decreasing, ending at the packed length):

* queries of request b: ``q[:, cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` with their positions in
  ``q_positions[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]``;
* its context keys: ``k/v[:, cu_seqlens_k[b]:cu_seqlens_k[b + 1]]`` with ``k_positions`` and
  ``k_valid`` sliced the same way;
* its page (optional): ``page_k/page_v[:, cu_seqlens_page[b]:cu_seqlens_page[b + 1]]``.

A request's queries attend only to its own context and page, with the rule of
:mod:`fusionrag_llm.kernels.q_sparse_attention`. Decode is ``cu_seqlens_q = arange(B + 1)``.
``max_seqlen_q`` (the largest per-request query count) sizes the grid and must not be smaller than
the true maximum (rows beyond it would be left unwritten); when omitted it is read from
``cu_seqlens_q`` (one device sync) and all offsets are validated on the host. Pass it on hot paths
to avoid the sync (the offsets are then trusted).
"""

from __future__ import annotations

import torch

from ._common import (check, check_devices, check_head_dim, check_last_dim_contiguous,
                      default_scale, interpreting, require_triton, triton)
from .q_sparse_attention import check_attention_inputs, q_sparse_attention_ref

_OP = "q_sparse_attention_varlen"
_LOG2E = 1.4426950408889634


def _check_offsets(op, name, cu, n_req=None):
    """cu [B + 1] int offsets into a packed dimension of length ``total``."""
    check(isinstance(cu, torch.Tensor) and cu.dim() == 1 and cu.shape[0] >= 2, op,
          f"{name} must be a 1-D tensor of B + 1 >= 2 offsets")
    check(cu.dtype in (torch.int32, torch.int64), op, f"{name} has dtype {cu.dtype}; allowed: int32, int64")
    check(n_req is None or cu.shape[0] == n_req + 1, op,
          f"{name} has {cu.shape[0]} entries, expected B + 1 = {n_req} + 1 like cu_seqlens_q")


def _check_offset_values(op, name, cu, total):
    """Host-side check of the offset values (one sync); returns the largest segment length."""
    vals = cu.tolist()
    check(vals[0] == 0 and vals[-1] == total, op,
          f"{name} must start at 0 and end at the packed length {total}, got {vals[0]}..{vals[-1]}")
    lengths = [b - a for a, b in zip(vals[:-1], vals[1:])]
    check(min(lengths) >= 0, op, f"{name} must be non-decreasing, got {vals}")
    return max(lengths)


def check_varlen_inputs(op, q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, cu_seqlens_k,
                        page_k, page_v, page_positions, cu_seqlens_page, max_seqlen_q):
    """Validate a packed call; returns max_seqlen_q (computed when it was None)."""
    check_attention_inputs(op, q, q_positions, k, v, k_positions, k_valid, page_k, page_v, page_positions)
    _check_offsets(op, "cu_seqlens_q", cu_seqlens_q)
    n_req = cu_seqlens_q.shape[0] - 1
    _check_offsets(op, "cu_seqlens_k", cu_seqlens_k, n_req)
    check((page_k is None) == (cu_seqlens_page is None), op,
          "cu_seqlens_page must be given exactly when a page is given")
    if page_k is not None:
        _check_offsets(op, "cu_seqlens_page", cu_seqlens_page, n_req)
    if max_seqlen_q is not None:
        check(isinstance(max_seqlen_q, int) and max_seqlen_q >= 0, op,
              f"max_seqlen_q must be a non-negative int, got {max_seqlen_q!r}")
        return max_seqlen_q
    if page_k is not None:
        _check_offset_values(op, "cu_seqlens_page", cu_seqlens_page, page_k.shape[1])
    _check_offset_values(op, "cu_seqlens_k", cu_seqlens_k, k.shape[1])
    return _check_offset_values(op, "cu_seqlens_q", cu_seqlens_q, q.shape[1])


def q_sparse_attention_varlen(q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, cu_seqlens_k,
                              scale=None, page_k=None, page_v=None, page_positions=None,
                              cu_seqlens_page=None, max_seqlen_q=None):
    """Triton Q-sparse attention over B packed requests (layout in the module docstring).

    q [Hq, Tq, D], q_positions [Tq] int64, cu_seqlens_q [B+1]; k/v [Hkv, Tk, D], k_positions [Tk]
    int64, k_valid [Tk] bool or None, cu_seqlens_k [B+1]; page_k/page_v [Hkv, Tp, D],
    page_positions [Tp] int64, cu_seqlens_page [B+1]. Returns out [Hq, Tq, D] in q's dtype.
    """
    require_triton(_OP)
    max_seqlen_q = check_varlen_inputs(_OP, q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid,
                                       cu_seqlens_k, page_k, page_v, page_positions, cu_seqlens_page,
                                       max_seqlen_q)
    out, _ = launch_forward(q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, cu_seqlens_k,
                            page_k, page_v, page_positions, cu_seqlens_page, scale, max_seqlen_q,
                            with_v=True, store_lse=False)
    return out


def launch_forward(q, q_positions, cu_q, k, v, k_positions, k_valid, cu_k, page_k, page_v,
                   page_positions, cu_p, scale, max_seqlen_q, with_v, store_lse, op=_OP):
    """Launch the forward kernel on validated inputs; returns (out or None, lse2 or None).

    lse2 [Hq, Tq] float32 is the log2-domain log-sum-exp of ``scale * log2(e) * q.k`` over the
    visible keys (-inf for rows that see nothing); critical_scores uses it.
    """
    from .q_sparse_attention import _q_sparse_fwd_kernel

    check_devices(op, q=q, q_positions=q_positions, cu_seqlens_q=cu_q, k=k, v=v,
                  k_positions=k_positions, k_valid=k_valid, cu_seqlens_k=cu_k, page_k=page_k,
                  page_v=page_v, page_positions=page_positions, cu_seqlens_page=cu_p)
    hq, tq, d = q.shape
    hkv = k.shape[0]
    check_head_dim(op, d)
    check_last_dim_contiguous(op, q=q, k=k, v=v, page_k=page_k, page_v=page_v)
    q_positions, k_positions = q_positions.contiguous(), k_positions.contiguous()
    cu_q, cu_k = cu_q.to(torch.int64).contiguous(), cu_k.to(torch.int64).contiguous()
    valid = None if k_valid is None else k_valid.contiguous().view(torch.uint8)
    has_page = page_k is not None
    pk, pv = (page_k, page_v) if has_page else (k, v)
    p_pos = page_positions.contiguous() if has_page else k_positions
    cu_p = cu_p.to(torch.int64).contiguous() if has_page else cu_k
    out = torch.empty_like(q, memory_format=torch.contiguous_format) if with_v else None
    lse = torch.empty((hq, tq), dtype=torch.float32, device=q.device) if store_lse else None
    group = hq // hkv
    cfg = launch_config(d, max_seqlen_q * group)
    n_req = cu_q.shape[0] - 1
    grid = (max(1, triton.cdiv(max_seqlen_q * group, cfg["BLOCK_M"])), hkv, n_req)
    if tq == 0 or n_req == 0:
        return out, lse
    _q_sparse_fwd_kernel[grid](
        q, q_positions, cu_q, k, v, k_positions, valid if valid is not None else k_positions, cu_k,
        pk, pv, p_pos, cu_p, out if with_v else q, lse if store_lse else q_positions,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        pk.stride(0), pk.stride(1), pv.stride(0), pv.stride(1),
        out.stride(0) if with_v else 0, out.stride(1) if with_v else 0, tq,
        default_scale(scale, d) * _LOG2E, GROUP=group, HEAD_DIM=d, HAS_VALID=valid is not None,
        HAS_PAGE=has_page, WITH_V=with_v, STORE_LSE=store_lse,
        F32=q.dtype == torch.float32 or interpreting(), **cfg)
    return out, lse


def launch_config(head_dim: int, rows_max: int) -> dict:
    """Tile sizes: tiny tiles under the interpreter (speed), flash-attention-like ones on GPU."""
    if interpreting():
        return {"BLOCK_M": 16, "BLOCK_N": 32}
    block_m = 16 if rows_max <= 16 else 32 if rows_max <= 32 else 64
    return {"BLOCK_M": block_m, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}


def q_sparse_attention_varlen_ref(q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid,
                                  cu_seqlens_k, scale=None, page_k=None, page_v=None,
                                  page_positions=None, cu_seqlens_page=None, max_seqlen_q=None):
    """Pure-torch reference of :func:`q_sparse_attention_varlen`: one reference call per request."""
    op = _OP + "_ref"
    for max_len in (max_seqlen_q, None):  # the reference also checks the offset values
        check_varlen_inputs(op, q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid,
                            cu_seqlens_k, page_k, page_v, page_positions, cu_seqlens_page, max_len)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    cp = cu_seqlens_page.tolist() if page_k is not None else None
    out = torch.empty_like(q)
    for b in range(len(cq) - 1):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        page = (None, None, None)
        if cp is not None:
            ps = slice(cp[b], cp[b + 1])
            page = (page_k[:, ps], page_v[:, ps], page_positions[ps])
        out[:, qs] = q_sparse_attention_ref(
            q[:, qs], q_positions[qs], k[:, ks], v[:, ks], k_positions[ks],
            None if k_valid is None else k_valid[ks], scale, *page)
    return out
