"""Query-guided critical-token scores (FusionRAG's online selection).

    scores[j] = sum over query heads h and query tokens i of softmax_j(scale * q[h, i] . k[h', j])

with the visibility rule of :mod:`fusionrag_llm.kernels.q_sparse_attention` (key j visible to query
i when ``k_valid[j]`` and ``k_positions[j] <= q_positions[i]``) and GQA (h' = h // (Hq // Hkv)).
The softmax runs over the given keys only: to include the question's own keys in the denominator,
append them to ``k`` and ignore their scores.

Two passes, no attention matrix in memory: pass 1 is the Q-sparse forward kernel without values,
storing each row's log-sum-exp; pass 2 walks key tiles, recomputes the scores tile by tile,
normalises them with the stored log-sum-exp and sums the columns. Per-KV-head partial sums are
reduced on the host (deterministic, no atomics).
"""

from __future__ import annotations

import torch

from ._common import (KEY_NEVER, QUERY_NONE, check_devices, check_head_dim,
                      check_last_dim_contiguous, default_scale, interpreting, require_triton, tl,
                      triton)
from .q_sparse_attention import (check_attention_inputs, launch_fitting, launch_forward, masked_key_positions,
                                 masked_softmax)

_OP = "critical_scores"
_LOG2E = 1.4426950408889634
_REF_CHUNK_ELEMENTS = 1 << 24

if triton is not None:
    _KEY_NEVER = tl.constexpr(KEY_NEVER)
    _QUERY_NONE = tl.constexpr(QUERY_NONE)

    @triton.jit
    def _column_sums_kernel(Q, Q_POS, LSE, K, K_POS, K_VALID, PARTIAL, n_q, n_k, stride_qh,
                            stride_qn, stride_kh, stride_kn, stride_lh, stride_ph, qk_scale,
                            GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, HAS_VALID: tl.constexpr, F32: tl.constexpr):
        """Grid (key blocks, Hkv): PARTIAL[kv_head, j] = sum of normalised probs of key j."""
        kv_head = tl.program_id(1).to(tl.int64)
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        in_range = offs_n < n_k
        k_pos = tl.load(K_POS + offs_n, mask=in_range, other=_KEY_NEVER)
        if HAS_VALID:
            ok = tl.load(K_VALID + offs_n, mask=in_range, other=0) != 0
            k_pos = tl.where(ok, k_pos, _KEY_NEVER)
        k_min = tl.min(k_pos, axis=0)
        k = tl.load(K + kv_head * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                    mask=in_range[:, None], other=0.0)
        if F32:
            k = k.to(tl.float32)
        col = tl.zeros([BLOCK_N], tl.float32)
        for m0 in range(0, n_q * GROUP, BLOCK_M):
            rows = m0 + tl.arange(0, BLOCK_M)
            row_ok = rows < n_q * GROUP
            tok = rows // GROUP
            head = kv_head * GROUP + rows % GROUP
            q_pos = tl.load(Q_POS + tok, mask=row_ok, other=_QUERY_NONE)
            if tl.max(q_pos, axis=0) >= k_min:  # skip query tiles wholly before the key tile
                q = tl.load(Q + head[:, None] * stride_qh + tok[:, None] * stride_qn + offs_d[None, :],
                            mask=row_ok[:, None], other=0.0)
                if F32:
                    s = tl.dot(q.to(tl.float32), tl.trans(k), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(k))
                lse = tl.load(LSE + head * stride_lh + tok, mask=row_ok, other=float("-inf"))
                lse = tl.where(lse == float("-inf"), 0.0, lse)  # such rows see no key anyway
                vis = k_pos[None, :] <= q_pos[:, None]
                col += tl.sum(tl.where(vis, tl.exp2(s * qk_scale - lse[:, None]), 0.0), axis=0)
        tl.store(PARTIAL + kv_head * stride_ph + offs_n, col, mask=in_range)


def critical_scores(q, q_positions, k, k_positions, k_valid, scale=None):
    """Triton critical scores: q [Hq, Nq, D], q_positions [Nq] int64, k [Hkv, Nk, D],
    k_positions [Nk] int64, k_valid [Nk] bool or None -> scores [Nk] float32.

    CUDA tensors (CPU under ``TRITON_INTERPRET=1``), last dimension contiguous, D in {16..128}.
    Invalid keys score 0.

    >>> top = critical_scores(q_question, qpos, k_ctx, kpos, valid).topk(n_recompute)  # doctest: +SKIP
    """

    require_triton(_OP)
    check_attention_inputs(_OP, q, q_positions, k, k, k_positions, k_valid)
    check_devices(_OP, q=q, q_positions=q_positions, k=k, k_positions=k_positions, k_valid=k_valid)
    check_head_dim(_OP, q.shape[2])
    check_last_dim_contiguous(_OP, q=q, k=k)
    hq, nq, d = q.shape
    hkv, nk, _ = k.shape
    if nq == 0 or nk == 0:
        return torch.zeros(nk, dtype=torch.float32, device=k.device)
    cu_q = torch.tensor([0, nq], dtype=torch.int64, device=q.device)
    cu_k = torch.tensor([0, nk], dtype=torch.int64, device=q.device)
    _, lse = launch_forward(q, q_positions, cu_q, k, k, k_positions, k_valid, cu_k, scale, nq, with_v=False,
                            store_lse=True, op=_OP)
    partial = torch.empty((hkv, nk), dtype=torch.float32, device=k.device)
    q_positions, k_positions = q_positions.contiguous(), k_positions.contiguous()
    valid = None if k_valid is None else k_valid.contiguous().view(torch.uint8)

    def run(cfg: dict) -> None:
        _column_sums_kernel[(triton.cdiv(nk, cfg["BLOCK_N"]), hkv)](
            q, q_positions, lse, k, k_positions, valid if valid is not None else k_positions, partial,
            nq, nk, q.stride(0), q.stride(1), k.stride(0), k.stride(1), lse.stride(0), partial.stride(0),
            default_scale(scale, d) * _LOG2E, GROUP=hq // hkv, HEAD_DIM=d, HAS_VALID=valid is not None,
            F32=q.dtype == torch.float32 or interpreting(), **cfg)

    launch_fitting(run, nq * (hq // hkv), q.element_size(), d, q.device)
    return partial.sum(0)


def critical_scores_ref(q, q_positions, k, k_positions, k_valid, scale=None):
    """Pure-torch reference of :func:`critical_scores` (same signature, any device).

    Processes the queries in chunks of at most ~16M scores; computes in fp32.
    """
    check_attention_inputs(_OP + "_ref", q, q_positions, k, k, k_positions, k_valid)
    hq, nq, d = q.shape
    hkv, nk, _ = k.shape
    scale = default_scale(scale, d)
    kf, pos = k.float(), masked_key_positions(k_positions, k_valid)
    qf = q.float().reshape(hkv, hq // hkv, nq, d)  # [Hkv, G, Nq, D]
    scores = torch.zeros(nk, dtype=torch.float32, device=k.device)
    step = max(1, _REF_CHUNK_ELEMENTS // max(1, hq * nk))
    for i0 in range(0, nq, step):
        probs = masked_softmax(qf[:, :, i0:i0 + step], q_positions[i0:i0 + step], kf, pos, scale)
        scores += probs.sum(dim=(0, 1, 2))
    return scores
