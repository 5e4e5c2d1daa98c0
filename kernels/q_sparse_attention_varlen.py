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

``q_sparse_attention_spans`` takes each request's keys as a span ``[k_starts[b], k_ends[b])`` of ``k``
instead of packed end to end: caches that sit apart in one pool, each read up to its used length.
"""

from __future__ import annotations

import torch

from ._common import check, require_triton
from .q_sparse_attention import check_attention_inputs, launch_forward, q_sparse_attention_ref

_OP = "q_sparse_attention_varlen"


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


def _check_spans(op, q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, k_ends, max_seqlen_q):
    check_attention_inputs(op, q, q_positions, k, v, k_positions, k_valid)
    _check_offsets(op, "cu_seqlens_q", cu_seqlens_q)
    n_req = cu_seqlens_q.shape[0] - 1
    for name, t in (("k_starts", k_starts), ("k_ends", k_ends)):
        check(isinstance(t, torch.Tensor) and t.dim() == 1 and t.shape[0] == n_req, op,
              f"{name} must be a 1-D tensor of B = {n_req} offsets, like cu_seqlens_q")
        check(t.dtype in (torch.int32, torch.int64), op, f"{name} has dtype {t.dtype}; allowed: int32, int64")
    check(isinstance(max_seqlen_q, int) and max_seqlen_q >= 0, op,
          f"max_seqlen_q must be a non-negative int, got {max_seqlen_q!r}")


def q_sparse_attention_spans(q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, k_ends,
                             max_seqlen_q, scale=None):
    """Triton Q-sparse attention of B requests whose keys are spans of ``k``: request b's queries
    ``q[:, cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` attend to ``k/v[:, k_starts[b]:k_ends[b]]`` (positions
    and validity sliced alike). The offsets are trusted (no sync); ``max_seqlen_q`` sizes the grid."""
    require_triton(_OP)
    _check_spans(_OP, q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, k_ends, max_seqlen_q)
    out, _ = launch_forward(q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, None, None, None,
                            None, scale, max_seqlen_q, with_v=True, store_lse=False, k_ends=k_ends)  # fmt: skip
    return out


def q_sparse_attention_spans_ref(q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, k_ends,
                                 max_seqlen_q, scale=None):
    """Pure-torch reference of :func:`q_sparse_attention_spans`: one reference call per request."""
    _check_spans(_OP + "_ref", q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, k_ends, max_seqlen_q)
    cq, starts, ends = cu_seqlens_q.tolist(), k_starts.tolist(), k_ends.tolist()
    out = torch.empty_like(q)
    for b, (start, end) in enumerate(zip(starts, ends)):
        qs, ks = slice(cq[b], cq[b + 1]), slice(start, end)
        out[:, qs] = q_sparse_attention_ref(q[:, qs], q_positions[qs], k[:, ks], v[:, ks], k_positions[ks],
                                            None if k_valid is None else k_valid[ks], scale)  # fmt: skip
    return out
