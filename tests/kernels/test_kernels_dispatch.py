"""Backend choice: argument > FUSIONRAG_KERNELS > auto (triton on CUDA tensors, else reference)."""

import pytest
import torch
from kernel_cases import make_case, needs_triton

from fusionrag_llm.kernels import dispatch
from fusionrag_llm.kernels.q_sparse_attention import q_sparse_attention_ref


def test_auto_on_cpu_is_torch(monkeypatch):
    monkeypatch.delenv(dispatch.BACKEND_ENV, raising=False)
    assert dispatch.resolve_backend(torch.zeros(1)) == "torch"


def test_auto_prefers_reference_when_kernel_cannot_run(monkeypatch):
    monkeypatch.delenv(dispatch.BACKEND_ENV, raising=False)
    assert dispatch.resolve_backend(torch.zeros(1), kernel_ok=False) == "torch"
    assert dispatch.resolve_backend(torch.zeros(1), "triton", kernel_ok=False) == "triton"


def test_env_and_argument_override(monkeypatch):
    monkeypatch.setenv(dispatch.BACKEND_ENV, "triton")
    assert dispatch.resolve_backend(torch.zeros(1)) == "triton"
    assert dispatch.resolve_backend(torch.zeros(1), backend="torch") == "torch"
    monkeypatch.setenv(dispatch.BACKEND_ENV, "cuda")
    with pytest.raises(ValueError, match="allowed: auto, torch, triton"):
        dispatch.resolve_backend(torch.zeros(1))
    with pytest.raises(ValueError, match="backend argument is 'fast'"):
        dispatch.resolve_backend(torch.zeros(1), backend="fast")


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_dispatched_calls_agree(backend):
    case = make_case(5, 40, 4, 2, 16)
    out = dispatch.q_sparse_attention(*case.args(), None, *case.page(), backend=backend)
    torch.testing.assert_close(out, q_sparse_attention_ref(*case.args(), None, *case.page()),
                               rtol=1e-4, atol=1e-5)
    cu = torch.tensor([0, 5])
    cu_k = torch.tensor([0, 40])
    packed = dispatch.q_sparse_attention_varlen(case.q, case.q_positions, cu, case.k, case.v,
                                                case.k_positions, case.k_valid, cu_k, None,
                                                *case.page(), cu, backend=backend)
    torch.testing.assert_close(packed, out, rtol=1e-4, atol=1e-5)
    scores = dispatch.critical_scores(case.q, case.q_positions, case.k, case.k_positions,
                                      case.k_valid, backend=backend)
    assert scores.shape == (40,) and scores.dtype == torch.float32
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16)
    rot = dispatch.apply_rotary(case.k, case.k_positions, inv_freq, backend=backend)
    assert rot.shape == case.k.shape
