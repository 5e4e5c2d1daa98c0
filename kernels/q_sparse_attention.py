"""Q-sparse attention: a sparse set of queries at absolute positions over a whole context KV.

The queries are the recompute set (the paper's "Q index"): arbitrary tokens with their absolute
positions. The keys are the request's context (shared chunk KV, possibly with stale or missing
entries, hence ``k_valid``). A query at position p sees every valid key at position <= p; the
causal rule is by position, never by index, so neither keys nor queries need to be sorted.

    out[h, i] = sum_j softmax_j(scale * q[h, i] . k[h', j]) v[h', j],
    j over {keys with k_valid and k_positions <= q_positions[i]},
    key/value head of query head h: h' = h // (Hq // Hkv)  (GQA).

A query row that sees no key at all returns zeros. The kernel packs the ``Hq // Hkv`` query heads
sharing a KV head into one row block (each K/V tile is loaded once per group) and runs an online
softmax over key tiles up to the last key that any query of the block sees (found by a backward
scan of the key positions); it compares positions element-wise only in tiles holding a key after
the block's earliest query. No ``[Nq, Nk]`` mask is ever built. Decode (one query per request) goes
through the same kernel; with few rows the keys can be cut into ranges, one program each, merged by a
second kernel (``splits``, ``split_count``).

This module holds the kernel, its launcher (``launch_forward``, shared by the span form in
``q_sparse_attention_varlen.py`` and by ``critical_scores.py``, which import it from here; this
module imports neither) and the torch reference.
"""

from __future__ import annotations

import functools

import torch

from ._common import (FLOAT_DTYPES, KEY_NEVER, QUERY_NONE, OutOfResources, check, check_devices, check_head_dim,
                      check_last_dim_contiguous, check_tensor, default_scale, device_index, interpreting,
                      require_triton, tl, triton)

_OP = "q_sparse_attention"
MAX_SPLITS = 32  # key ranges per request at most (split_count)
MIN_SPLIT_KEYS = 256  # keys per range at least
# Bound on the score elements the reference materialises per query chunk (fp32 elements).
_REF_CHUNK_ELEMENTS = 1 << 24
_LOG2E = 1.4426950408889634


if triton is not None:
    _KEY_NEVER = tl.constexpr(KEY_NEVER)
    _QUERY_NONE = tl.constexpr(QUERY_NONE)

    @triton.jit
    def _visible_end(pos_ptr, valid_ptr, start, end, q_max, HAS_VALID: tl.constexpr, BLOCK: tl.constexpr):
        """One past the last key of [start, end) that a query at ``q_max`` sees (``start`` if none).

        Scans backwards in chunks of ``BLOCK`` and stops at the first chunk holding a visible key,
        so sorted keys cost a scan of the invisible tail only.
        """
        stop = start
        hi = end
        while (hi > start) & (stop == start):
            offs = hi - BLOCK + tl.arange(0, BLOCK)
            ok = offs >= start
            k_pos = tl.load(pos_ptr + offs, mask=ok, other=_KEY_NEVER)
            if HAS_VALID:
                k_pos = tl.where(tl.load(valid_ptr + offs, mask=ok, other=0) != 0, k_pos, _KEY_NEVER)
            stop = tl.max(tl.where(k_pos <= q_max, offs + 1, start), axis=0)
            hi -= BLOCK
        return stop

    @triton.jit
    def _attend_keys(acc, m_i, l_i, q, q_pos, q_min, q_max, k_ptr, v_ptr, pos_ptr, valid_ptr, start, end,
                     stride_kn, stride_vn, offs_d, qk_scale, HAS_VALID: tl.constexpr,
                     WITH_V: tl.constexpr, F32: tl.constexpr, BLOCK_N: tl.constexpr):
        """Online-softmax update of (acc [M, D], m_i [M], l_i [M]) with keys [start, end).

        The loop stops after the last key any row can see and has no data-dependent branch around
        its loads (so they pipeline); an invisible tile before that is an exact no-op. Validity is
        an additive -inf column bias, and the per-element position test runs only on tiles holding
        a key after the block's earliest query (with sorted queries and keys: the diagonal tiles).
        """
        stop = _visible_end(pos_ptr, valid_ptr, start, end, q_max, HAS_VALID, 1024)
        for n0 in range(start, stop, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            in_range = offs_n < stop
            k_pos = tl.load(pos_ptr + offs_n, mask=in_range, other=_KEY_NEVER)
            k = tl.load(k_ptr + offs_n[:, None] * stride_kn + offs_d[None, :], mask=in_range[:, None], other=0.0)
            if F32:
                s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            if HAS_VALID:
                ok = tl.load(valid_ptr + offs_n, mask=in_range, other=0) != 0
                s = s * qk_scale + tl.where(ok, 0.0, float("-inf"))[None, :]
            else:
                s = s * qk_scale
            if tl.max(k_pos, axis=0) > q_min:  # some key of the tile lies after some query of the block
                s = tl.where(k_pos[None, :] <= q_pos[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
            p = tl.exp2(s - m_ref[:, None])
            alpha = tl.exp2(m_i - m_ref)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if WITH_V:
                v = tl.load(v_ptr + offs_n[:, None] * stride_vn + offs_d[None, :], mask=in_range[:, None], other=0.0)
                if F32:
                    pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
                else:
                    pv = tl.dot(p.to(v.dtype), v)
                acc = acc * alpha[:, None] + pv
            m_i = m_new
        return acc, m_i, l_i

    @triton.jit
    def _q_sparse_fwd_kernel(
            Q, Q_POS, CU_Q, K, V, K_POS, K_VALID, K_START, K_END, OUT, LSE,
            stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_on, stride_lh,
            stride_os, stride_ls, qk_scale, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, HAS_VALID: tl.constexpr, WITH_V: tl.constexpr,
            STORE_LSE: tl.constexpr, F32: tl.constexpr, SPLITS: tl.constexpr, MIN_SPLIT: tl.constexpr):
        """Grid (row blocks, Hkv, requests x SPLITS); rows are (query token, head in the GQA group) pairs.

        With SPLITS > 1 a request's keys are cut into SPLITS ranges of at least MIN_SPLIT keys (whole
        tiles), each range's program writes its normalised output and log-sum-exp at plane ``split`` of
        OUT / LSE, and ``_combine_splits_kernel`` merges the planes (split-K, "flash decoding")."""
        kv_head = tl.program_id(1).to(tl.int64)
        req = tl.program_id(2) // SPLITS
        split = tl.program_id(2) % SPLITS
        k_start, k_end = tl.load(K_START + req), tl.load(K_END + req)
        if SPLITS > 1:  # this program's range; past the keys it is empty (l = 0: out 0, lse -inf)
            chunk = tl.cdiv(tl.maximum(tl.cdiv(k_end - k_start, SPLITS), MIN_SPLIT), BLOCK_N) * BLOCK_N
            k_start += split * chunk
            k_end = tl.minimum(k_end, k_start + chunk)
            OUT += split * stride_os
            LSE += split * stride_ls
        q_start = tl.load(CU_Q + req)
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < (tl.load(CU_Q + req + 1) - q_start) * GROUP
        tok = q_start + rows // GROUP                  # [M] int64 query token index
        head = kv_head * GROUP + rows % GROUP          # [M] int64 query head
        offs_d = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + head[:, None] * stride_qh + tok[:, None] * stride_qn + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)
        if F32:
            q = q.to(tl.float32)
        q_pos = tl.load(Q_POS + tok, mask=row_ok, other=_QUERY_NONE)
        q_max = tl.max(q_pos, axis=0)
        q_min = tl.min(tl.where(row_ok, q_pos, _KEY_NEVER), axis=0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        acc, m_i, l_i = _attend_keys(
            acc, m_i, l_i, q, q_pos, q_min, q_max, K + kv_head * stride_kh, V + kv_head * stride_vh,
            K_POS, K_VALID, k_start, k_end, stride_kn, stride_vn,
            offs_d, qk_scale, HAS_VALID, WITH_V, F32, BLOCK_N)
        if WITH_V:
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # no visible key: acc is 0, so out is 0
            tl.store(OUT + head[:, None] * stride_oh + tok[:, None] * stride_on + offs_d[None, :],
                     out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
        if STORE_LSE:  # log2-domain log-sum-exp of the scaled scores; -inf when nothing is visible
            lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
            tl.store(LSE + head * stride_lh + tok, lse, mask=row_ok)

    @triton.jit
    def _combine_splits_kernel(PART, PART_LSE, OUT, stride_ps, stride_ph, stride_pn, stride_ls, stride_lh,
                               stride_oh, stride_on, SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr):
        """Grid (query tokens, Hq): out = sum_s 2^(lse_s - L) out_s with L = log2 sum_s 2^lse_s; 0 where no
        split saw a key."""
        tok = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1).to(tl.int64)
        planes = tl.arange(0, SPLITS)
        lse = tl.load(PART_LSE + planes * stride_ls + head * stride_lh + tok)
        top = tl.max(lse, axis=0)
        weight = tl.exp2(lse - tl.where(top == float("-inf"), 0.0, top))  # 0 for an empty range
        total = tl.sum(weight, axis=0)
        offs_d = tl.arange(0, HEAD_DIM)
        part = tl.load(PART + planes[:, None] * stride_ps + head * stride_ph + tok * stride_pn + offs_d[None, :],
                       mask=(weight > 0)[:, None], other=0.0)
        out = tl.sum(part * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
        tl.store(OUT + head * stride_oh + tok * stride_on + offs_d, out.to(OUT.dtype.element_ty))


def check_attention_inputs(op, q, q_positions, k, v, k_positions, k_valid) -> None:
    """Validate shapes and dtypes shared by the attention launchers and references."""
    check_tensor(q, op, "q [Hq, Nq, D]", 3, FLOAT_DTYPES)
    check_tensor(k, op, "k [Hkv, Nk, D]", 3, (q.dtype,))
    check_tensor(v, op, "v [Hkv, Nk, D]", 3, (q.dtype,))
    check_tensor(q_positions, op, "q_positions [Nq]", 1, (torch.int64,))
    check_tensor(k_positions, op, "k_positions [Nk]", 1, (torch.int64,))
    hq, nq, d = q.shape
    hkv, nk, _ = k.shape
    check(tuple(v.shape) == tuple(k.shape), op, f"v shape {tuple(v.shape)} != k shape {tuple(k.shape)}")
    check(k.shape[2] == d, op, f"k head dim {k.shape[2]} != q head dim {d}")
    check(hkv > 0 and hq % hkv == 0, op, f"query heads {hq} must be a multiple of kv heads {hkv}")
    check(q_positions.shape[0] == nq, op, f"q_positions has {q_positions.shape[0]} entries, q has {nq}")
    check(k_positions.shape[0] == nk, op, f"k_positions has {k_positions.shape[0]} entries, k has {nk}")
    if k_valid is not None:
        check_tensor(k_valid, op, "k_valid [Nk]", 1, (torch.bool,))
        check(k_valid.shape[0] == nk, op, f"k_valid has {k_valid.shape[0]} entries, k has {nk}")


def q_sparse_attention(q, q_positions, k, v, k_positions, k_valid, scale=None):
    """Triton Q-sparse attention of one request (see the module docstring for the semantics).

    q [Hq, Nq, D] (rotary applied), q_positions [Nq] int64, k/v [Hkv, Nk, D], k_positions [Nk]
    int64, k_valid [Nk] bool or None (all valid). Returns out [Hq, Nq, D] in q's dtype; rows with
    no visible key are zero.
    CUDA tensors (CPU under ``TRITON_INTERPRET=1``), last dimension contiguous, D in {16..128}.

    >>> out = q_sparse_attention(q, qpos, k, v, kpos, valid)  # doctest: +SKIP
    """
    require_triton(_OP)
    check_attention_inputs(_OP, q, q_positions, k, v, k_positions, k_valid)
    dev = q.device
    cu_q = torch.tensor([0, q.shape[1]], dtype=torch.int64, device=dev)
    cu_k = torch.tensor([0, k.shape[1]], dtype=torch.int64, device=dev)
    out, _ = launch_forward(q, q_positions, cu_q, k, v, k_positions, k_valid, cu_k, scale, q.shape[1],
                            with_v=True, store_lse=False, op=_OP)
    return out


def launch_forward(q, q_positions, cu_q, k, v, k_positions, k_valid, cu_k, scale, max_seqlen_q, with_v, store_lse,
                   op, k_ends=None, splits=1):
    """Launch the forward kernel on validated inputs; returns (out or None, lse2 or None).

    Request b's keys are ``[cu_k[b], cu_k[b + 1])``; with ``k_ends`` [B], ``[cu_k[b], k_ends[b])`` (``cu_k``
    then holds B starts: spans that need not be packed end to end, e.g. caches in one pool).

    lse2 [Hq, Tq] float32 is the log2-domain log-sum-exp of ``scale * log2(e) * q.k`` over the
    visible keys (-inf for rows that see nothing); critical_scores uses it.

    ``splits`` (a power of two; output only, not with ``store_lse``): each request's keys in that many
    ranges, one program each, merged by a second kernel (``split_count`` picks it for few, long rows).
    """
    check_devices(op, q=q, q_positions=q_positions, cu_seqlens_q=cu_q, k=k, v=v,
                  k_positions=k_positions, k_valid=k_valid, cu_seqlens_k=cu_k, k_ends=k_ends)
    hq, tq, d = q.shape
    hkv = k.shape[0]
    check_head_dim(op, d)
    check_last_dim_contiguous(op, q=q, k=k, v=v)
    q_positions, k_positions = q_positions.contiguous(), k_positions.contiguous()
    cu_q, cu_k = cu_q.to(torch.int64).contiguous(), cu_k.to(torch.int64).contiguous()
    k_starts, k_ends = (cu_k[:-1], cu_k[1:]) if k_ends is None else (cu_k, k_ends.to(torch.int64).contiguous())
    valid = None if k_valid is None else k_valid.contiguous().view(torch.uint8)
    # token-major ([Hq, Tq, D] strides over a [Tq, Hq, D] buffer): the output projection reads it as
    # [Tq, Hq * D] rows without a copy
    out = torch.empty((tq, hq, d), dtype=q.dtype, device=q.device).transpose(0, 1) if with_v else None
    lse = torch.empty((hq, tq), dtype=torch.float32, device=q.device) if store_lse else None
    group = hq // hkv
    n_req = cu_q.shape[0] - 1
    if tq == 0 or n_req == 0:
        return out, lse
    check(splits == 1 or (with_v and not store_lse), op, "splits > 1 computes the output only")
    dst, dst_lse = out if with_v else q, lse if store_lse else q_positions
    if splits > 1:  # each range's output and log-sum-exp in a plane of its own, merged below
        dst = torch.empty((splits, hq, tq, d), dtype=torch.float32, device=q.device)
        dst_lse = torch.empty((splits, hq, tq), dtype=torch.float32, device=q.device)

    def run(cfg: dict) -> None:
        grid = (max(1, triton.cdiv(max_seqlen_q * group, cfg["BLOCK_M"])), hkv, n_req * splits)
        _q_sparse_fwd_kernel[grid](
            q, q_positions, cu_q, k, v, k_positions, valid if valid is not None else k_positions, k_starts, k_ends,
            dst, dst_lse, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dst.stride(-3) if with_v else 0, dst.stride(-2) if with_v else 0,
            dst_lse.stride(-2) if dst_lse.dim() > 1 else tq, dst.stride(0) if splits > 1 else 0,
            dst_lse.stride(0) if splits > 1 else 0, default_scale(scale, d) * _LOG2E, GROUP=group, HEAD_DIM=d,
            HAS_VALID=valid is not None, WITH_V=with_v, STORE_LSE=store_lse or splits > 1,
            F32=q.dtype == torch.float32 or interpreting(), SPLITS=splits, MIN_SPLIT=MIN_SPLIT_KEYS, **cfg)

    launch_fitting(run, max_seqlen_q * group, q.element_size(), d, q.device)
    if splits > 1:
        _combine_splits_kernel[(tq, hq)](dst, dst_lse, out, dst.stride(0), dst.stride(1), dst.stride(2),
                                         dst_lse.stride(0), dst_lse.stride(1), out.stride(0), out.stride(1),
                                         SPLITS=splits, HEAD_DIM=d)  # fmt: skip
    return out, lse


def split_count(rows_max: int, num_kv_heads: int, num_requests: int, device: torch.device) -> int:
    """How many key ranges each request's keys are cut into (``launch_forward``'s ``splits``).

    One program per (row block, KV head, request) leaves most of a GPU idle when there are few rows:
    one decode token of an 8B model is 8 programs on a card of 132 multiprocessors, each reading all
    of its head's keys alone. Where every request's rows fit one block (decode, a few recomputed
    tokens), the keys are cut until there are about two programs per multiprocessor (at most
    ``MAX_SPLITS``; a range is never under ``MIN_SPLIT_KEYS`` keys, so short contexts use fewer). On
    the CPU (the interpreter) one range.
    """
    if device.type != "cuda" or rows_max > launch_config(rows_max, device=device)["BLOCK_M"]:
        return 1
    target = 2 * _multiprocessors(device.index)
    splits = 1
    while splits < MAX_SPLITS and num_kv_heads * num_requests * splits < target:
        splits *= 2
    return splits


def launch_config(rows_max: int, itemsize: int = 2, head_dim: int = 128, device: torch.device | None = None) -> dict:
    """Tile sizes: tiny tiles under the interpreter (speed), on GPU the fastest of a sweep, cut to the
    shared memory of ``device`` (``fit_shared_memory``; an H100's or H200's keeps the swept tiles).

    ``python bench/kernels/tune.py`` on an H100 (bf16, 32k context, head dim 128, GQA 4):
    up to 64 rows (query tokens x GQA group: decode, a few recomputed tokens) take 16-row blocks
    (more programs for a small grid) over 128-key tiles three stages deep; more than 128 rows take
    64 x 128 tiles, two stages. 65..128 rows (not swept) and float32 inputs, whose pipeline buffers
    are twice as large, keep the earlier tiles.
    """
    if interpreting():
        return {"BLOCK_M": 16, "BLOCK_N": 32}
    if itemsize <= 2 and rows_max <= 64:
        cfg = {"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3}
    elif itemsize <= 2 and rows_max > 128:
        cfg = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2}
    else:
        block_m = 16 if rows_max <= 16 else 32 if rows_max <= 32 else 64
        cfg = {"BLOCK_M": block_m, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
    if device is None or device.type != "cuda":
        return cfg
    return fit_shared_memory(cfg, head_dim, itemsize, _shared_memory_limit(device))


def shared_memory_bytes(cfg: dict, head_dim: int, itemsize: int) -> int:
    """About the shared memory the forward kernel's tiles take: a K and a V tile per pipeline stage, the
    query tile and the score tile (the swept tilings that ran on an H100 count up to 204 KiB here)."""
    stages = cfg.get("num_stages", 1)
    return ((2 * stages * cfg["BLOCK_N"] + cfg["BLOCK_M"]) * head_dim * itemsize
            + cfg["BLOCK_M"] * cfg["BLOCK_N"] * 4)  # fmt: skip


def fit_shared_memory(cfg: dict, head_dim: int, itemsize: int, limit: int) -> dict:
    """``cfg``, or the first smaller tiling that fits ``limit`` bytes of shared memory: fewer pipeline
    stages (down to one), then key tiles halved, then row tiles (neither below 16, what ``tl.dot`` takes).

    >>> fit_shared_memory({"BLOCK_M": 16, "BLOCK_N": 128, "num_stages": 3}, 128, 2, 101376)  # a 99 KiB card
    {'BLOCK_M': 16, 'BLOCK_N': 128, 'num_stages': 1}
    """
    cfg = dict(cfg)
    while shared_memory_bytes(cfg, head_dim, itemsize) > limit:
        if cfg.get("num_stages", 1) > 1:
            cfg["num_stages"] -= 1
        elif cfg["BLOCK_N"] > 16:
            cfg["BLOCK_N"] //= 2
        elif cfg["BLOCK_M"] > 16:
            cfg["BLOCK_M"] //= 2
        else:
            break
    return cfg


_REFUSED: dict[int, int] = {}  # device index -> shared memory bytes below the smallest tiling it refused


def launch_fitting(run, rows_max: int, itemsize: int, head_dim: int, device: torch.device):
    """What ``run(cfg)`` returns with ``launch_config``'s tiles; where the device refuses them for want of shared memory
    (the estimate is short of what the compiler allocates), again with smaller ones, remembered for the
    device. Raises the device's error when even the smallest tiling does not fit."""
    while True:
        cfg = launch_config(rows_max, itemsize, head_dim, device)
        try:
            return run(cfg)
        except OutOfResources:
            index = device_index(device)
            _REFUSED[index] = shared_memory_bytes(cfg, head_dim, itemsize) - 1
            if launch_config(rows_max, itemsize, head_dim, device) == cfg:  # nothing smaller to try
                raise


def _shared_memory_limit(device: torch.device) -> int:
    index = device_index(device)
    return min(_device_shared_memory(index), _REFUSED.get(index, 1 << 62))


@functools.cache
def _device_shared_memory(index: int) -> int:
    """Shared memory one block may use on CUDA device ``index`` (opted in: 227 KiB on an H100); a torch
    that does not say leaves the limit to ``launch_fitting``'s retries."""
    return int(getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", 0) or 1 << 62)


@functools.cache
def _multiprocessors(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def q_sparse_attention_ref(q, q_positions, k, v, k_positions, k_valid, scale=None):
    """Pure-torch reference of :func:`q_sparse_attention` (same signature, any device).

    Computes in fp32 and processes the queries in chunks so that at most ~16M scores exist at once
    (the CPU engine path runs long contexts through it). Returns out [Hq, Nq, D] in q's dtype.
    """
    check_attention_inputs(_OP + "_ref", q, q_positions, k, v, k_positions, k_valid)
    hq, nq, d = q.shape
    hkv, nk, _ = k.shape
    scale = default_scale(scale, d)
    kf, vf, pos = k.float(), v.float(), masked_key_positions(k_positions, k_valid)
    step = max(1, _REF_CHUNK_ELEMENTS // max(1, hq * nk))
    qf = q.float().reshape(hkv, hq // hkv, nq, d)  # [Hkv, G, Nq, D]
    out = torch.empty((hkv, hq // hkv, nq, d), dtype=torch.float32, device=q.device)
    for i0 in range(0, nq, step):
        probs = masked_softmax(qf[:, :, i0:i0 + step], q_positions[i0:i0 + step], kf, pos, scale)
        out[:, :, i0:i0 + step] = torch.matmul(probs, vf[:, None])
    return out.reshape(hq, nq, d).to(q.dtype)


def masked_key_positions(k_positions, k_valid):
    """k_positions with invalid keys moved to a position no query reaches."""
    if k_valid is None:
        return k_positions
    return torch.where(k_valid, k_positions, torch.full_like(k_positions, KEY_NEVER))


def masked_softmax(qc, q_pos, k, k_pos, scale):
    """Softmax of the scaled scores over the keys each query sees (key position <= query position).

    qc [Hkv, G, M, D] fp32, q_pos [M], k [Hkv, N, D] fp32, k_pos [N] (``masked_key_positions``).
    Returns probs [Hkv, G, M, N]; rows with no visible key have all-zero probabilities.

    The G query heads of a key/value head are one matrix product (not G products against copies of its
    keys), the mask touches only the keys some query cannot see (a question's scores over its context:
    its own tokens), and every later step works in place: at 6k keys about 0.6x the time of the
    out-of-place form, with the same numbers where M is 4 or more (the old form took another BLAS path
    for fewer rows: up to 3e-7 apart there).
    """
    hkv, group, rows, dim = qc.shape
    s = torch.bmm(qc.reshape(hkv, group * rows, dim), k.transpose(1, 2)).view(hkv, group, rows, k.shape[1])
    s.mul_(scale)
    hidden = torch.nonzero(k_pos > q_pos.min()).flatten() if rows else k_pos[:0]
    if len(hidden):
        s[..., hidden] = s[..., hidden].masked_fill_(k_pos[hidden][None, :] > q_pos[:, None], float("-inf"))
    row_max = _row_max(s)[..., None].clamp_min(torch.finfo(torch.float32).min)  # all -inf rows -> exp gives 0
    e = s.sub_(row_max).exp_()
    denom = e.sum(-1, keepdim=True)
    return e.div_(torch.where(denom > 0, denom, torch.ones_like(denom)))


def _row_max(s):
    """Max over the last dimension; -inf for an empty key set."""
    if s.shape[-1] == 0:
        return torch.full(s.shape[:-1], float("-inf"), dtype=s.dtype, device=s.device)
    return s.amax(-1)


__all__ = ["q_sparse_attention", "q_sparse_attention_ref", "check_attention_inputs", "launch_config",
           "fit_shared_memory", "launch_fitting", "shared_memory_bytes", "launch_forward", "masked_key_positions",
           "masked_softmax", "split_count"]
