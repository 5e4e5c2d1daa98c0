"""Batched Q-sparse attention: several requests in one launch, queries packed along the token dimension.

Layout (B requests; offsets are int32 or int64):

* queries of request b: ``q[:, cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` with their positions in
  ``q_positions[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` (``cu_seqlens_q`` [B + 1], flash-attn style);
* its keys: the span ``k/v[:, k_starts[b]:k_ends[b]]`` of one buffer, with ``k_positions`` and ``k_valid``
  sliced the same way: caches that sit apart in one pool, each read up to its used length.

A request's queries attend only to its own keys, with the rule of
:mod:`fusionrag_llm.kernels.q_sparse_attention`. Decode is ``cu_seqlens_q = arange(B + 1)``.
``max_seqlen_q`` (the largest per-request query count) sizes the grid and must not be smaller than
the true maximum (rows beyond it would be left unwritten); the offsets are trusted (no device sync).
"""

from __future__ import annotations

import torch

from ._common import check, require_triton
from .q_sparse_attention import (MAX_SPLITS, check_attention_inputs, launch_forward, q_sparse_attention_ref,
                                 split_count)

_OP = "q_sparse_attention_varlen"


def _check_spans(op, q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, k_ends, max_seqlen_q,
                 splits=None):
    check_attention_inputs(op, q, q_positions, k, v, k_positions, k_valid)
    check(isinstance(cu_seqlens_q, torch.Tensor) and cu_seqlens_q.dim() == 1 and cu_seqlens_q.shape[0] >= 2, op,
          "cu_seqlens_q must be a 1-D tensor of B + 1 >= 2 offsets")
    check(cu_seqlens_q.dtype in (torch.int32, torch.int64), op,
          f"cu_seqlens_q has dtype {cu_seqlens_q.dtype}; allowed: int32, int64")
    n_req = cu_seqlens_q.shape[0] - 1
    for name, t in (("k_starts", k_starts), ("k_ends", k_ends)):
        check(isinstance(t, torch.Tensor) and t.dim() == 1 and t.shape[0] == n_req, op,
              f"{name} must be a 1-D tensor of B = {n_req} offsets, like cu_seqlens_q")
        check(t.dtype in (torch.int32, torch.int64), op, f"{name} has dtype {t.dtype}; allowed: int32, int64")
    check(isinstance(max_seqlen_q, int) and max_seqlen_q >= 0, op,
          f"max_seqlen_q must be a non-negative int, got {max_seqlen_q!r}")
    check(splits is None or (isinstance(splits, int) and 1 <= splits <= MAX_SPLITS and splits & (splits - 1) == 0),
          op, f"splits must be None or a power of two from 1 to {MAX_SPLITS}, got {splits!r}")


def q_sparse_attention_spans(q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, k_ends,
                             max_seqlen_q, scale=None, splits=None):
    """Triton Q-sparse attention of B requests whose keys are spans of ``k``: request b's queries
    ``q[:, cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` attend to ``k/v[:, k_starts[b]:k_ends[b]]`` (positions
    and validity sliced alike). The offsets are trusted (no sync); ``max_seqlen_q`` sizes the grid.
    ``splits``: key ranges per request, each in a program of its own, then merged (a power of two; None:
    ``split_count``'s choice for the device, which splits decode-sized calls on a GPU only)."""
    require_triton(_OP)
    _check_spans(_OP, q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, k_ends, max_seqlen_q,
                 splits)
    if splits is None:
        splits = split_count(max_seqlen_q * (q.shape[0] // k.shape[0]), k.shape[0], len(k_starts), q.device)
    out, _ = launch_forward(q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, scale, max_seqlen_q,
                            with_v=True, store_lse=False, op=_OP, k_ends=k_ends, splits=splits)  # fmt: skip
    return out


def q_sparse_attention_spans_ref(q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, k_ends,
                                 max_seqlen_q, scale=None, splits=None):
    """Pure-torch reference of :func:`q_sparse_attention_spans`: one reference call per request (``splits``
    changes only the order of the kernel's sums, so the reference has one result for all)."""
    _check_spans(_OP + "_ref", q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, k_ends, max_seqlen_q,
                 splits)
    cq, starts, ends = cu_seqlens_q.tolist(), k_starts.tolist(), k_ends.tolist()
    out = torch.empty_like(q)
    for b, (start, end) in enumerate(zip(starts, ends)):
        qs, ks = slice(cq[b], cq[b + 1]), slice(start, end)
        out[:, qs] = q_sparse_attention_ref(q[:, qs], q_positions[qs], k[:, ks], v[:, ks], k_positions[ks],
                                            None if k_valid is None else k_valid[ks], scale)  # fmt: skip
    return out
