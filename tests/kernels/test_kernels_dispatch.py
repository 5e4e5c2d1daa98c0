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


@pytest.mark.parametrize("capability, auto", [((9, 0), "triton"), ((8, 0), "triton"), ((7, 5), "torch")])
def test_auto_runs_triton_on_cards_triton_supports(monkeypatch, capability, auto):
    """Compute capability 8.0 and later (H100, A100, RTX 30xx/40xx); a T4 or V100 keeps the reference."""
    from types import SimpleNamespace

    monkeypatch.delenv(dispatch.BACKEND_ENV, raising=False)
    monkeypatch.setattr(dispatch, "HAS_TRITON", True)
    monkeypatch.setattr(dispatch, "_capability", lambda index: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    on_card = SimpleNamespace(device=torch.device("cuda", 0))  # what resolve_backend reads of a tensor
    assert dispatch.resolve_backend(on_card) == auto
    assert dispatch.resolve_backend(on_card, backend="triton") == "triton"  # asked for: the launchers decide


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
    case = make_case(5, 40, 4, 2, 16)  # 40 context keys and the recompute set's 5
    out = dispatch.q_sparse_attention(*case.args(), backend=backend)
    torch.testing.assert_close(out, q_sparse_attention_ref(*case.args()), rtol=1e-4, atol=1e-5)
    spans = dispatch.q_sparse_attention_spans(case.q, case.q_positions, torch.tensor([0, 5]), case.k, case.v,
                                              case.k_positions, case.k_valid, torch.tensor([0]), torch.tensor([45]), 5,
                                              backend=backend)  # fmt: skip
    torch.testing.assert_close(spans, out, rtol=1e-4, atol=1e-5)
    scores = dispatch.critical_scores(case.q, case.q_positions, case.k, case.k_positions,
                                      case.k_valid, backend=backend)
    assert scores.shape == (45,) and scores.dtype == torch.float32
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16)
    rot = dispatch.apply_rotary(case.k, case.k_positions, inv_freq, backend=backend)
    assert rot.shape == case.k.shape
