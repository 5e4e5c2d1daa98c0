"""Critical-token scores: reference vs dense softmax column sums, Triton vs reference."""

import pytest
import torch
from kernel_cases import dense_attention, make_case, needs_cuda, needs_triton

from fusionrag_llm.kernels import critical_scores as cs_mod
from fusionrag_llm.kernels.critical_scores import critical_scores, critical_scores_ref

# (nq, nk, hq, hkv, d): question lengths 1..70, ragged contexts, GQA 1/3/4, D 16/64/128.
CASES = [(1, 45, 4, 4, 16), (3, 70, 6, 2, 64), (17, 100, 8, 2, 128), (70, 61, 4, 1, 16)]


def _question_case(nq, nk, hq, hkv, d, seed=0):
    """Question tokens after a context with holes; a few question positions fall inside it."""
    case = make_case(nq, nk, hq, hkv, d, recompute=False, seed=seed)
    case.q_positions = torch.arange(nk - nq // 3, nk - nq // 3 + nq)[torch.randperm(nq)]
    return case


def _dense_scores(case, scale=None):
    probs = dense_attention(case.q, case.q_positions, case.k, case.v, case.k_positions,
                            case.k_valid, scale, return_probs=True)
    return probs.sum(dim=(0, 1)).float()


@pytest.mark.parametrize("nq,nk,hq,hkv,d", CASES)
def test_reference_matches_dense_column_sums(nq, nk, hq, hkv, d):
    case = _question_case(nq, nk, hq, hkv, d, seed=nk)
    got = critical_scores_ref(case.q, case.q_positions, case.k, case.k_positions, case.k_valid, 0.2)
    torch.testing.assert_close(got, _dense_scores(case, 0.2), rtol=1e-5, atol=1e-5)
    assert torch.all(got[~case.k_valid] == 0)


def test_reference_query_chunking_and_total_mass(monkeypatch):
    monkeypatch.setattr(cs_mod, "_REF_CHUNK_ELEMENTS", 200)
    case = _question_case(9, 30, 4, 2, 16, seed=1)
    case.q_positions[0] = -1  # sees nothing: contributes no mass
    got = critical_scores_ref(case.q, case.q_positions, case.k, case.k_positions, case.k_valid)
    torch.testing.assert_close(got, _dense_scores(case), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.sum(), torch.tensor(4.0 * 8), rtol=1e-5, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("nq,nk,hq,hkv,d", CASES)
def test_triton_matches_reference(nq, nk, hq, hkv, d):
    case = _question_case(nq, nk, hq, hkv, d, seed=nq)
    args = (case.q, case.q_positions, case.k, case.k_positions, case.k_valid)
    torch.testing.assert_close(critical_scores(*args), critical_scores_ref(*args), rtol=1e-4, atol=1e-5)


@needs_triton
def test_triton_unsorted_context_and_no_mask():
    case = _question_case(5, 40, 4, 2, 32, seed=2)
    perm = torch.randperm(40)
    args = (case.q, case.q_positions, case.k[:, perm].contiguous(), case.k_positions[perm], None)
    torch.testing.assert_close(critical_scores(*args), critical_scores_ref(*args), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fn", [critical_scores_ref, pytest.param(critical_scores, marks=needs_triton)])
def test_validation_errors(fn):
    case = _question_case(3, 20, 4, 2, 16)
    good = [case.q, case.q_positions, case.k, case.k_positions, case.k_valid]
    bad = [
        ({0: case.q[:3]}, "multiple of kv heads"),
        ({2: case.k.half()}, "k \\[Hkv, Nk, D\\] has dtype"),
        ({3: case.k_positions[:5]}, "k_positions has 5 entries"),
        ({4: case.k_valid.int()}, "k_valid \\[Nk\\] has dtype"),
    ]
    for over, msg in bad:
        args = [over.get(i, a) for i, a in enumerate(good)]
        with pytest.raises(ValueError, match=msg):
            fn(*args)


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("nq", [8, 64])  # the launch configurations of up to 64 and of over 128 rows
def test_gpu_parity(dtype, nq):
    case = make_case(nq, 8000, 32, 8, 128, recompute=False, dtype=dtype, device="cuda")
    case.q_positions = torch.arange(8000, 8000 + nq, device="cuda")
    args = (case.q, case.q_positions, case.k, case.k_positions, case.k_valid)
    got, want = critical_scores(*args), critical_scores_ref(*args)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())
