"""Packed (varlen) Q-sparse attention and decode through the same kernel."""

import pytest
import torch
from kernel_cases import make_case, needs_triton

from fusionrag_llm.kernels.q_sparse_attention import q_sparse_attention, q_sparse_attention_ref
from fusionrag_llm.kernels.q_sparse_attention_varlen import (q_sparse_attention_varlen,
                                                             q_sparse_attention_varlen_ref)


def _pack(cases, with_page=True):
    """Concatenate single-request cases along the token dimension; returns varlen kwargs."""
    def offsets(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)

    kw = dict(
        q=torch.cat([c.q for c in cases], 1), q_positions=torch.cat([c.q_positions for c in cases]),
        cu_seqlens_q=offsets([c.q.shape[1] for c in cases]),
        k=torch.cat([c.k for c in cases], 1), v=torch.cat([c.v for c in cases], 1),
        k_positions=torch.cat([c.k_positions for c in cases]),
        k_valid=torch.cat([c.k_valid for c in cases]),
        cu_seqlens_k=offsets([c.k.shape[1] for c in cases]))
    if with_page:
        kw.update(page_k=torch.cat([c.page_k for c in cases], 1),
                  page_v=torch.cat([c.page_v for c in cases], 1),
                  page_positions=torch.cat([c.page_positions for c in cases]),
                  cu_seqlens_page=offsets([c.page_k.shape[1] for c in cases]))
    return kw


def _per_request(cases, with_page):
    return torch.cat([q_sparse_attention_ref(*c.args(), None, *(c.page() if with_page else (None,) * 3))
                      for c in cases], 1)


@pytest.mark.parametrize("with_page", [True, False])
def test_varlen_reference_is_per_request(with_page):
    cases = [make_case(n, m, 6, 2, 16, seed=n) for n, m in [(3, 40), (17, 75), (1, 9)]]
    got = q_sparse_attention_varlen_ref(**_pack(cases, with_page))
    torch.testing.assert_close(got, _per_request(cases, with_page), rtol=1e-6, atol=1e-6)


@needs_triton
@pytest.mark.parametrize("with_page", [True, False])
@pytest.mark.parametrize("sizes,hq,hkv,d", [([(3, 40), (17, 75), (1, 9)], 6, 2, 64),
                                            ([(5, 33), (2, 70)], 4, 1, 128)])
def test_varlen_triton_matches_reference(with_page, sizes, hq, hkv, d):
    cases = [make_case(n, m, hq, hkv, d, seed=n + m) for n, m in sizes]
    kw = _pack(cases, with_page)
    got = q_sparse_attention_varlen(**kw)
    torch.testing.assert_close(got, q_sparse_attention_varlen_ref(**kw), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got, _per_request(cases, with_page), rtol=1e-4, atol=1e-5)


@needs_triton
def test_varlen_request_without_queries_and_explicit_max_seqlen():
    cases = [make_case(n, m, 4, 2, 16, seed=n) for n, m in [(4, 30), (1, 20), (6, 50)]]
    kw = _pack(cases)
    kw["cu_seqlens_q"] = torch.tensor([0, 4, 4, 10], dtype=torch.int64)  # request 1: no query
    keep = [*range(4), *range(5, 11)]
    kw["q"], kw["q_positions"] = kw["q"][:, keep], kw["q_positions"][keep]
    got = q_sparse_attention_varlen(**kw, max_seqlen_q=6)
    torch.testing.assert_close(got, q_sparse_attention_varlen_ref(**kw), rtol=1e-4, atol=1e-5)


@needs_triton
def test_decode_batch():
    """Decode: one query per request at the next position, previous tokens all visible."""
    cases = [make_case(1, m, 8, 2, 64, seed=m, n_fresh=1) for m in (37, 64, 90)]
    for c in cases:
        c.q_positions[:] = c.k.shape[1]  # the new token; its own K/V is the one page entry
        c.page_positions[:] = c.k.shape[1]
    kw = _pack(cases)
    got = q_sparse_attention_varlen(**kw)
    torch.testing.assert_close(got, _per_request(cases, True), rtol=1e-4, atol=1e-5)
    single = q_sparse_attention(*cases[1].args(), None, *cases[1].page())
    torch.testing.assert_close(got[:, 1:2], single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fn", [q_sparse_attention_varlen_ref,
                                pytest.param(q_sparse_attention_varlen, marks=needs_triton)])
def test_varlen_validation_errors(fn):
    cases = [make_case(n, m, 4, 2, 16, seed=n) for n, m in [(3, 30), (2, 20)]]
    bad = [  # packed lengths: 5 queries, 50 keys, 5 page entries
        (dict(cu_seqlens_q=torch.tensor([0, 3, 4])), "cu_seqlens_q must start at 0 and end"),
        (dict(cu_seqlens_q=torch.tensor([0, 6, 5])), "cu_seqlens_q must be non-decreasing"),
        (dict(cu_seqlens_k=torch.tensor([0, 50])), "cu_seqlens_k has 2 entries, expected B \\+ 1"),
        (dict(cu_seqlens_k=torch.tensor([0, 60, 50])), "cu_seqlens_k must be non-decreasing"),
        (dict(cu_seqlens_k=torch.tensor([0, 30, 40])), "end at the packed length 50"),
        (dict(cu_seqlens_k=torch.tensor([0.0, 30, 50])), "cu_seqlens_k has dtype"),
        (dict(cu_seqlens_page=None), "cu_seqlens_page must be given exactly"),
        (dict(max_seqlen_q=-1), "max_seqlen_q must be a non-negative int"),
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
    from fusionrag_llm.kernels.q_sparse_attention_varlen import q_sparse_attention_spans, q_sparse_attention_spans_ref

    cases = [make_case(n, m, 4, 2, 32, page=False, seed=n + m) for n, m in [(1, 40), (3, 75), (1, 9)]]
    starts, layout, filler = [], [], lambda n: torch.randn(2, n, 32)
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
