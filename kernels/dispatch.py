"""One name per kernel for the engine: the Triton path on CUDA tensors, the torch reference otherwise.

The choice, strongest first: the ``backend=`` argument, then the ``FUSIONRAG_KERNELS`` environment
variable (``torch``, ``triton`` or ``auto``), then ``auto``: Triton when it is importable and the
first tensor argument is on a CUDA device of compute capability 8.0 or later (``triton_card``), else
the reference. Forcing ``triton`` on CPU tensors only works under ``TRITON_INTERPRET=1`` (the
launchers say so otherwise).

>>> from fusionrag_llm.kernels import dispatch
>>> dispatch.resolve_backend(torch.zeros(1), backend="torch")  # doctest: +SKIP
'torch'
"""

from __future__ import annotations

import functools
import os

import torch

from . import critical_scores as _scores
from . import elementwise as _elementwise
from . import q_sparse_attention as _attn
from . import q_sparse_attention_varlen as _varlen
from . import rotary as _rotary
from ._common import HAS_TRITON, device_index

BACKEND_ENV = "FUSIONRAG_KERNELS"
BACKENDS = ("auto", "torch", "triton")


def resolve_backend(tensor: torch.Tensor, backend: str | None = None, kernel_ok: bool = True) -> str:
    """``"triton"`` or ``"torch"`` for a call whose data lives on ``tensor``'s device.

    ``kernel_ok=False`` (e.g. a head dim the attention kernels do not tile) makes ``auto`` pick the
    reference; an explicit ``triton`` still goes to the launcher, which explains the refusal.
    """
    choice = (backend or os.environ.get(BACKEND_ENV) or "auto").strip().lower()
    if choice not in BACKENDS:
        source = "backend argument" if backend else f"${BACKEND_ENV}"
        raise ValueError(f"{source} is {choice!r}; allowed: {', '.join(BACKENDS)}")
    if choice != "auto":
        return choice
    return "triton" if HAS_TRITON and kernel_ok and tensor.device.type == "cuda" and triton_card(tensor.device) else "torch"


def triton_card(device: torch.device) -> bool:
    """Whether ``auto`` runs the Triton kernels on this CUDA device: compute capability 8.0 and later
    (what Triton supports; the kernels' bf16 tiles need it) and any ROCm device."""
    return bool(torch.version.hip) or _capability(device_index(device)) >= (8, 0)


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))


def _tiled_head_dim(t: torch.Tensor) -> bool:
    d = t.shape[-1]
    return 16 <= d <= 128 and d & (d - 1) == 0


def q_sparse_attention(q, q_positions, k, v, k_positions, k_valid, scale=None, *, backend: str | None = None):
    """Dispatching :func:`fusionrag_llm.kernels.q_sparse_attention.q_sparse_attention`."""
    use_triton = resolve_backend(q, backend, _tiled_head_dim(q)) == "triton"
    fn = _attn.q_sparse_attention if use_triton else _attn.q_sparse_attention_ref
    return fn(q, q_positions, k, v, k_positions, k_valid, scale)


def q_sparse_attention_spans(q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, k_ends,
                             max_seqlen_q, scale=None, splits=None, *, backend: str | None = None):
    """Dispatching :func:`fusionrag_llm.kernels.q_sparse_attention_varlen.q_sparse_attention_spans`."""
    use_triton = resolve_backend(q, backend, _tiled_head_dim(q)) == "triton"
    fn = _varlen.q_sparse_attention_spans if use_triton else _varlen.q_sparse_attention_spans_ref
    return fn(q, q_positions, cu_seqlens_q, k, v, k_positions, k_valid, k_starts, k_ends, max_seqlen_q, scale,
              splits)


def apply_rotary(x, positions, inv_freq, out=None, slots=None, *, backend: str | None = None):
    """Dispatching :func:`fusionrag_llm.kernels.rotary.apply_rotary`."""
    fn = _rotary.apply_rotary if resolve_backend(x, backend) == "triton" else _rotary.apply_rotary_ref
    return fn(x, positions, inv_freq, out, slots)


def critical_scores(q, q_positions, k, k_positions, k_valid, scale=None, *, backend: str | None = None):
    """Dispatching :func:`fusionrag_llm.kernels.critical_scores.critical_scores`."""
    use_triton = resolve_backend(q, backend, _tiled_head_dim(q)) == "triton"
    fn = _scores.critical_scores if use_triton else _scores.critical_scores_ref
    return fn(q, q_positions, k, k_positions, k_valid, scale)


def _norm_on_triton(x, backend: str | None) -> bool:
    """The norm kernels hold a row in one program: wider rows take the reference under ``auto``."""
    return resolve_backend(x, backend, x.shape[-1] <= _elementwise.MAX_ROW) == "triton"


def rms_norm(x, weight, eps, *, backend: str | None = None):
    """Dispatching :func:`fusionrag_llm.kernels.elementwise.rms_norm`."""
    fn = _elementwise.rms_norm if _norm_on_triton(x, backend) else _elementwise.rms_norm_ref
    return fn(x, weight, eps)


def silu_mul(gate, up, *, backend: str | None = None):
    """Dispatching :func:`fusionrag_llm.kernels.elementwise.silu_mul`."""
    fn = _elementwise.silu_mul if resolve_backend(gate, backend) == "triton" else _elementwise.silu_mul_ref
    return fn(gate, up)


def add_rms_norm(x, delta, weight, eps, *, backend: str | None = None):
    """Dispatching :func:`fusionrag_llm.kernels.elementwise.add_rms_norm`."""
    fn = _elementwise.add_rms_norm if _norm_on_triton(x, backend) else _elementwise.add_rms_norm_ref
    return fn(x, delta, weight, eps)
