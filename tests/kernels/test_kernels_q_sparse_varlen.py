"""Batched Q-sparse attention over spans of one key buffer, and decode through the same kernel."""

import pytest
import torch
from kernel_cases import make_case, needs_cuda, needs_triton

from fusionrag_llm.kernels import q_sparse_attention as q_sparse_attention_module
from fusionrag_llm.kernels.q_sparse_attention import q_sparse_attention, q_sparse_attention_ref, split_count
from fusionrag_llm.kernels.q_sparse_attention_varlen import q_sparse_attention_spans, q_sparse_attention_spans_ref


def _pack(cases, cu_type=torch.int32):
    """Single-request cases end to end along the token dimension; returns span kwargs."""
    def offsets(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=cu_type, device=cases[0].q.device)

    cu_k = offsets([c.k.shape[1] for c in cases])
    return dict(
        q=torch.cat([c.q for c in cases], 1), q_positions=torch.cat([c.q_positions for c in cases]),
        cu_seqlens_q=offsets([c.q.shape[1] for c in cases]),
        k=torch.cat([c.k for c in cases], 1), v=torch.cat([c.v for c in cases], 1),
        k_positions=torch.cat([c.k_positions for c in cases]),
        k_valid=torch.cat([c.k_valid for c in cases]), k_starts=cu_k[:-1], k_ends=cu_k[1:],
        max_seqlen_q=max(c.q.shape[1] for c in cases))


def _per_request(cases):
    return torch.cat([q_sparse_attention_ref(*c.args()) for c in cases], 1)


@pytest.mark.parametrize("recompute", [True, False])
def test_spans_reference_is_per_request(recompute):
    cases = [make_case(n, m, 6, 2, 16, recompute=recompute, seed=n) for n, m in [(3, 40), (17, 75), (1, 9)]]
    got = q_sparse_attention_spans_ref(**_pack(cases))
    torch.testing.assert_close(got, _per_request(cases), rtol=1e-6, atol=1e-6)


@needs_triton
@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("sizes,hq,hkv,d", [([(3, 40), (17, 75), (1, 9)], 6, 2, 64),
                                            ([(5, 33), (2, 70)], 4, 1, 128)])
def test_spans_triton_matches_reference(recompute, sizes, hq, hkv, d):
    cases = [make_case(n, m, hq, hkv, d, recompute=recompute, seed=n + m) for n, m in sizes]
    kw = _pack(cases)
    got = q_sparse_attention_spans(**kw)
    torch.testing.assert_close(got, q_sparse_attention_spans_ref(**kw), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got, _per_request(cases), rtol=1e-4, atol=1e-5)


@needs_triton
def test_spans_request_without_queries():
    cases = [make_case(n, m, 4, 2, 16, seed=n) for n, m in [(4, 30), (1, 20), (6, 50)]]
    kw = _pack(cases)
    kw["cu_seqlens_q"] = torch.tensor([0, 4, 4, 10], dtype=torch.int64)  # request 1: no query
    keep = [*range(4), *range(5, 11)]
    kw["q"], kw["q_positions"] = kw["q"][:, keep], kw["q_positions"][keep]
    got = q_sparse_attention_spans(**kw)
    torch.testing.assert_close(got, q_sparse_attention_spans_ref(**kw), rtol=1e-4, atol=1e-5)


@needs_triton
def test_decode_batch():
    """Decode: one query per request at the next position, previous tokens all visible."""
    cases = [make_case(1, m, 8, 2, 64, seed=m, n_fresh=1) for m in (37, 64, 90)]
    # the one query is the new token at position m; its own K/V is the last key
    assert all(c.q_positions.tolist() == [m] == c.k_positions[-1:].tolist() for c, m in zip(cases, (37, 64, 90)))
    kw = _pack(cases)
    got = q_sparse_attention_spans(**kw)
    torch.testing.assert_close(got, _per_request(cases), rtol=1e-4, atol=1e-5)
    single = q_sparse_attention(*cases[1].args())
    torch.testing.assert_close(got[:, 1:2], single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fn", [q_sparse_attention_spans_ref,
                                pytest.param(q_sparse_attention_spans, marks=needs_triton)])
def test_spans_validation_errors(fn):
    cases = [make_case(n, m, 4, 2, 16, seed=n) for n, m in [(3, 30), (2, 20)]]
    bad = [
        (dict(cu_seqlens_q=torch.tensor([5])), "cu_seqlens_q must be a 1-D tensor of B \\+ 1 >= 2"),
        (dict(cu_seqlens_q=torch.tensor([0.0, 3, 5])), "cu_seqlens_q has dtype"),
        (dict(k_starts=torch.tensor([0])), "k_starts must be a 1-D tensor of B = 2 offsets"),
        (dict(k_ends=torch.tensor([30.0, 50])), "k_ends has dtype"),
        (dict(max_seqlen_q=-1), "max_seqlen_q must be a non-negative int"),
        (dict(splits=3), "splits must be None or a power of two from 1 to 32, got 3"),
        (dict(splits=64), "splits must be None or a power of two from 1 to 32, got 64"),
    ]
    for over, msg in bad:
        kw = _pack(cases)
        kw.update(over)
        with pytest.raises(ValueError, match=msg):
            fn(**kw)


@needs_triton
def test_spans_read_each_request_s_keys_where_they_sit_in_one_pool():
    """Each request's keys are a span of one buffer, apart from the others and read only up to a used
    length (caches in one pool): the same result as one call per request over its own keys."""
    cases = [make_case(n, m, 4, 2, 32, recompute=False, seed=n + m) for n, m in [(1, 40), (3, 75), (1, 9)]]
    starts, filler = [], lambda n: torch.randn(2, n, 32)
    pool_k, pool_v, pool_pos, pool_valid, at = [], [], [], [], 0
    for case in cases:  # 5 unused slots before each request's keys and 7 after its used length
        for part_k, part_v, pos, valid in ((filler(5), filler(5), torch.zeros(5, dtype=torch.long), torch.ones(5, dtype=torch.bool)),
                                           (case.k, case.v, case.k_positions, case.k_valid),
                                           (filler(7), filler(7), torch.zeros(7, dtype=torch.long), torch.ones(7, dtype=torch.bool))):  # fmt: skip
            if part_k is case.k:
                starts.append(at)
            pool_k.append(part_k), pool_v.append(part_v), pool_pos.append(pos), pool_valid.append(valid)
            at += part_k.shape[1]
    k_starts = torch.tensor(starts)
    k_ends = k_starts + torch.tensor([c.k.shape[1] for c in cases])
    q = torch.cat([c.q for c in cases], 1)
    kw = dict(q=q, q_positions=torch.cat([c.q_positions for c in cases]),
              cu_seqlens_q=torch.tensor([0, 1, 4, 5]), k=torch.cat(pool_k, 1), v=torch.cat(pool_v, 1),
              k_positions=torch.cat(pool_pos), k_valid=torch.cat(pool_valid), k_starts=k_starts, k_ends=k_ends,
              max_seqlen_q=3)  # fmt: skip
    want = torch.cat([q_sparse_attention_ref(*c.args()) for c in cases], 1)
    torch.testing.assert_close(q_sparse_attention_spans_ref(**kw), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(q_sparse_attention_spans(**kw), want, rtol=1e-4, atol=1e-5)


def _decode_and_short_recomputes(device="cpu", dtype=torch.float32):
    """Rows that fit one block (the calls split_count splits): decode tokens over short and long
    contexts with holes, two recomputed tokens, and a request with no visible key."""
    cases = [make_case(1, m, 8, 2, 64, seed=m, n_fresh=1, dtype=dtype, device=device) for m in (37, 600, 1300)]
    cases.append(make_case(2, 900, 8, 2, 64, seed=5, dtype=dtype, device=device))
    cases.append(make_case(1, 300, 8, 2, 64, recompute=False, seed=7, dtype=dtype, device=device))
    cases[-1].q_positions.fill_(-1)  # sees no key: zeros
    return cases


@needs_triton
@pytest.mark.parametrize("splits", [2, 8, 32])
def test_keys_cut_into_ranges_give_the_same_attention(splits):
    """Split-K: each request's keys in ``splits`` ranges (of at least 256 keys, so short contexts leave
    ranges empty), one program each, merged by their log-sum-exps: the reference's result."""
    cases = _decode_and_short_recomputes()
    kw = _pack(cases)
    got = q_sparse_attention_spans(**kw, splits=splits)
    torch.testing.assert_close(got, _per_request(cases), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got, q_sparse_attention_spans(**kw, splits=1), rtol=1e-5, atol=1e-6)
    assert got[:, -1].abs().max() == 0


def test_split_count_cuts_keys_only_for_few_rows_on_a_gpu(monkeypatch):
    """About two programs per multiprocessor for decode-sized calls; one range for many rows or on the CPU."""
    monkeypatch.setattr(q_sparse_attention_module, "_multiprocessors", lambda index: 132)  # an H100 / H200
    cuda = torch.device("cuda")
    assert split_count(4, 8, 1, cuda) == 32  # one decode token of an 8-KV-head model: 8 programs alone
    assert split_count(4, 8, 8, cuda) == 8
    assert split_count(4, 8, 32, cuda) == 2
    assert split_count(4, 8, 64, cuda) == 1
    assert split_count(4 * 40, 8, 1, cuda) == 1  # a recompute set: rows enough for many blocks
    assert split_count(4, 8, 1, torch.device("cpu")) == 1


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_decode_on_a_gpu_splits_long_keys_and_matches_the_reference(dtype):
    """On CUDA the default choice cuts a decode batch's keys into ranges: the compiled kernel and merge
    against the reference (which computes in float32 from the same inputs), up to 8k keys."""
    cases = [*_decode_and_short_recomputes("cuda", dtype), make_case(1, 8192, 8, 2, 64, seed=3, n_fresh=1, dtype=dtype,
                                                                     device="cuda")]  # fmt: skip
    kw = _pack(cases)
    assert split_count(2 * 4, 2, len(cases), torch.device("cuda")) > 1
    tol = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 else dict(rtol=1e-4, atol=1e-4)
    want = _per_request(cases)
    torch.testing.assert_close(q_sparse_attention_spans(**kw), want, **tol)
    torch.testing.assert_close(q_sparse_attention_spans(**kw, splits=1), want, **tol)
