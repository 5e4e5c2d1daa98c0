"""Shared helpers of the kernel modules: the guarded triton import and launcher validation.

Triton is optional: when it is missing (or broken) every kernel module still imports, the
``*_ref`` functions work and the Triton launchers raise a ``RuntimeError`` that says why.
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

try:  # guarded: the references must stay usable without triton
    import triton
    import triton.language as tl
except Exception as exc:  # noqa: BLE001 - any import failure means "no triton"
    triton = None
    tl = None
    TRITON_IMPORT_ERROR: Exception | None = exc
    logger.debug("triton unavailable: %s", exc)
else:
    TRITON_IMPORT_ERROR = None

HAS_TRITON = triton is not None

try:  # what a launch raises when a tiling needs more shared memory than the device has
    from triton.runtime.errors import OutOfResources
except Exception:  # noqa: BLE001 - no triton (or another layout of it): nothing raises it

    class OutOfResources(Exception):  # type: ignore[no-redef]
        pass

def device_index(device: torch.device) -> int:
    """The index of CUDA ``device`` (``cuda`` alone: the current one)."""
    return device.index if device.index is not None else torch.cuda.current_device()


# Sentinels for positions: invalid keys get KEY_NEVER, padded query rows QUERY_NONE, so one integer
# comparison implements validity and causality. Real positions must lie strictly between them.
KEY_NEVER = 2**62
QUERY_NONE = -(2**62)

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """True when Triton runs kernels with its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def require_triton(op: str) -> None:
    """Raise a clear error when the Triton path of ``op`` cannot run here."""
    if not HAS_TRITON:
        raise RuntimeError(
            f"{op}: triton is not importable ({TRITON_IMPORT_ERROR!r}); "
            f"use {op}_ref or the dispatcher in fusionrag_llm.kernels.dispatch"
        )


def check(cond: bool, op: str, message: str) -> None:
    """Raise ``ValueError(f"{op}: {message}")`` unless ``cond``."""
    if not cond:
        raise ValueError(f"{op}: {message}")


def check_tensor(t, op: str, name: str, ndim: int, dtypes: tuple) -> None:
    """Check that ``t`` is a tensor with ``ndim`` dimensions and one of ``dtypes``."""
    check(isinstance(t, torch.Tensor), op, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check(t.dim() == ndim, op, f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
    check(t.dtype in dtypes, op, f"{name} has dtype {t.dtype}; allowed: {allowed}")


def check_devices(op: str, **tensors) -> None:
    """All tensors on one device; CUDA, or CPU only under the Triton interpreter."""
    present = {k: t for k, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    check(len(devices) == 1, op, "all tensors must be on one device, got "
          + ", ".join(f"{k}={t.device}" for k, t in present.items()))
    device = devices.pop()
    ok = device.type == "cuda" or (device.type == "cpu" and interpreting())
    check(ok, op, f"the triton path needs CUDA tensors (or CPU with TRITON_INTERPRET=1), got "
          f"{device}; use the *_ref function for other devices")


def check_head_dim(op: str, head_dim: int) -> None:
    """The attention kernels tile the head dimension whole: a power of two in [16, 128]."""
    ok = 16 <= head_dim <= 128 and head_dim & (head_dim - 1) == 0
    check(ok, op, f"head dim {head_dim} is not supported; allowed: 16, 32, 64, 128")


def check_last_dim_contiguous(op: str, **tensors) -> None:
    """Rows must be contiguous along the head dimension (vectorised loads)."""
    for name, t in tensors.items():
        if t is not None and t.shape[-1] > 1:
            check(t.stride(-1) == 1, op, f"{name} must be contiguous in its last dimension "
                  f"(stride {t.stride(-1)}); call .contiguous() first")


def default_scale(scale: float | None, head_dim: int) -> float:
    """Softmax scale: ``1 / sqrt(head_dim)`` unless given."""
    return float(scale) if scale is not None else head_dim**-0.5
