"""Block-quantized CPU linear layers for decode steps: 8-bit and 4-bit weights, float inputs.

A decode step multiplies a few rows by every weight of the model, so on a CPU its time is the time to
read the weights. Reading them as 8-bit (``q8``) or 4-bit (``q4``) blocks instead of float32 reads
about 4x / 6.4x fewer bytes. The formats are GGUF's: blocks of 32 weights along the input dimension,

* ``q8`` (GGUF Q8_0): ``w = d * q``, ``q`` in [-127, 127], one half-float scale ``d`` per block;
* ``q4`` (GGUF Q4_1): ``w = d * q + m``, ``q`` in [0, 15], a half-float scale ``d`` and minimum ``m``
  per block;

so weights that came from a GGUF file in that format quantize back to the same numbers. The input
rows stay float32 (llama.cpp quantizes them to 8 bits too; here that was no faster, and it changed
answers, docs/BENCHMARKS.md): ``y = sum_b d_b sum(q x) (+ m_b sum(x))`` over the blocks.

On an AVX-512 build a 4-bit weight whose rows come in whole tiles of 16 is kept ``tiled`` (``tile``):
the same bytes and scales, transposed per tile so that one vector holds a byte of 16 rows and a
block's scale and minimum apply to 16 outputs at once (about 1.4x faster than one row at a time).

The kernel is in a small C file (``cpu_kernels.c``, beside this module, which also holds the compiled
decode step of ``models/fast_decode.py``) compiled once per machine with the system C compiler (AVX2 /
AVX-512 where the CPU has them, plain C otherwise) and called through ``ctypes``; it runs its rows on
OpenMP threads (the runtime torch already loaded, so the two share one thread pool). Where no compiler
works, ``load_library`` raises ``RuntimeError`` saying why and callers keep the float path. The same
file quantizes float32 weights in one pass (``fr_quantize``, the numbers of ``quantize_ref`` to the
bit): what loading a model does to every linear weight, about 8x faster than the torch reference.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ._common import check, check_tensor

logger = logging.getLogger(__name__)

BLOCK = 32
TILE = 16  # rows per tile of a tiled 4-bit weight
FORMATS = ("q8", "q4")

_SOURCE = (Path(__file__).parent / "cpu_kernels.c").read_text()

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
_HALF_MAX = 65504.0
_library: ctypes.CDLL | None = None
_library_error: str | None = None


@dataclass(frozen=True)
class QuantWeight:
    """One weight [n, k] in a block format: ``q`` int8 [n, k] (q8) or uint8 [n, k / 2] (q4), ``d``
    (and for q4 ``m``) float16 [n, k / 32], as GGUF stores them; or, ``tiled`` (q4, see ``tile``), the
    same numbers in tiles of 16 rows."""

    fmt: str
    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None
    shape: tuple[int, int]
    tiled: bool = False

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.d, self.m) if t is not None)


def quantize(weight: torch.Tensor, fmt: str) -> QuantWeight:
    """Block-quantize a float weight [n, k] (k a multiple of 32) into ``fmt`` ("q8" or "q4"): in one pass of
    the compiled kernel for a float32 weight on the CPU, else through ``quantize_ref`` (the same numbers)."""
    return _quantized(weight, fmt, None)[0]


def quantize_exact(weight: torch.Tensor, tolerance: float = 1e-3) -> QuantWeight | None:
    """The 4-bit, else the 8-bit form of ``weight`` if it holds the weight's numbers (each block within
    ``tolerance`` of its step ``d``: float rounding, not quantization), else None. Weights that came
    from a GGUF file in one of these formats pass; trained float weights do not."""
    for fmt in ("q4", "q8"):
        qw, exact = _quantized(weight, fmt, tolerance)
        if exact:
            return qw
    return None


def quantize_ref(weight: torch.Tensor, fmt: str) -> QuantWeight:
    """Pure-torch reference of ``quantize`` (any float dtype and device)."""
    n, k = _check_weight(weight, fmt)
    blocks = weight.detach().float().cpu().reshape(n, k // BLOCK, BLOCK)
    check(bool(blocks.isfinite().all()) and float(blocks.abs().max()) * 2 <= _HALF_MAX, "quantize", _RANGE)
    if fmt == "q8":
        d = (blocks.abs().amax(dim=-1) / 127.0).half()  # the steps are computed from the stored scales
        step = d.float()
        q = torch.round(blocks / torch.where(step > 0, step, 1.0)[..., None]).clamp(-127, 127).to(torch.int8)
        return QuantWeight(fmt, q.reshape(n, k).contiguous(), d.contiguous(), None, (n, k))
    low = blocks.amin(dim=-1).half()
    d = ((blocks.amax(dim=-1) - low.float()) / 15.0).half()
    step = d.float()
    q = torch.round((blocks - low.float()[..., None]) / torch.where(step > 0, step, 1.0)[..., None]).clamp(0, 15)
    q = q.to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)  # byte i: element i (low nibble), element i + 16 (high)
    return QuantWeight(fmt, packed.reshape(n, k // 2).contiguous(), d.contiguous(), low.contiguous(), (n, k))


def holds_exactly(weight: torch.Tensor, qw: QuantWeight, tolerance: float) -> bool:
    """Whether every block of ``qw`` gives back ``weight``'s values to within ``tolerance`` of its step."""
    n, k = qw.shape
    error = (dequantize(qw) - weight.detach().float().cpu()).abs().reshape(n, k // BLOCK, BLOCK).amax(dim=-1)
    return bool((error <= tolerance * qw.d.float()).all())


_RANGE = f"weights must be finite and within +-{_HALF_MAX / 2:g} (the block scales are half floats)"


def _check_weight(weight: torch.Tensor, fmt: str) -> tuple[int, int]:
    op = "quantize"
    check(fmt in FORMATS, op, f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    check_tensor(weight, op, "weight", 2, (torch.float32, torch.float16, torch.bfloat16))
    n, k = weight.shape
    check(k % BLOCK == 0, op, f"the input dimension must be a multiple of {BLOCK}, got {k}")
    return n, k


def _quantized(weight: torch.Tensor, fmt: str, tolerance: float | None) -> tuple[QuantWeight, bool | None]:
    """``fmt``'s form of ``weight`` and, given a ``tolerance``, whether it holds the weight exactly."""
    n, k = _check_weight(weight, fmt)
    lib = native_library() if weight.dtype == torch.float32 and weight.device.type == "cpu" else None
    if lib is not None and n * k:
        w = weight.detach().contiguous()
        q = torch.empty((n, k) if fmt == "q8" else (n, k // 2), dtype=torch.int8 if fmt == "q8" else torch.uint8)
        d = torch.empty((n, k // BLOCK), dtype=torch.float16)
        m = torch.empty((n, k // BLOCK), dtype=torch.float16) if fmt == "q4" else None
        status = lib.fr_quantize(8 if fmt == "q8" else 4, w.data_ptr(), n, k, q.data_ptr(), d.data_ptr(),
                                 m.data_ptr() if m is not None else None,
                                 ctypes.c_float(-1.0 if tolerance is None else tolerance))  # fmt: skip
        check(status != -2, "quantize", _RANGE)
        if status >= 0:
            return QuantWeight(fmt, q, d, m, (n, k)), None if tolerance is None else status == 1
    qw = quantize_ref(weight, fmt)
    return qw, None if tolerance is None else holds_exactly(weight, qw, tolerance)


def native_library() -> ctypes.CDLL | None:
    """The compiled kernels (``load_library``), or None where they cannot be built: callers keep torch."""
    try:
        return _library or load_library()
    except RuntimeError:
        return None


def concat_rows(weights: list[QuantWeight]) -> QuantWeight:
    """One weight holding the rows of ``weights`` (one format, one input size) in order; tiled if all are."""
    fmts, inputs = {w.fmt for w in weights}, {w.shape[1] for w in weights}
    check(len(fmts) == 1 and len(inputs) == 1, "concat_rows", f"weights must share a format and input size, got {fmts}, {inputs}")
    tiled = all(w.tiled for w in weights)
    if not tiled:
        weights = [untile(w) for w in weights]
    m = None if weights[0].m is None else torch.cat([w.m for w in weights])
    return QuantWeight(weights[0].fmt, torch.cat([w.q for w in weights]), torch.cat([w.d for w in weights]), m,
                       (sum(w.shape[0] for w in weights), weights[0].shape[1]), tiled)  # fmt: skip


def row_slice(weight: QuantWeight, start: int, rows: int) -> QuantWeight:
    """Rows [start, start + rows) of ``weight``, as views of its tensors (contiguous: rows are); a tiled
    weight cut between its tiles gives an untiled copy."""
    if weight.tiled and (start % TILE or rows % TILE):
        weight = untile(weight)
    step = TILE if weight.tiled else 1
    first, end = start // step, (start + rows) // step
    return QuantWeight(weight.fmt, weight.q[first:end], weight.d[first:end],
                       None if weight.m is None else weight.m[first:end], (rows, weight.shape[1]), weight.tiled)  # fmt: skip


def can_tile(weight: QuantWeight) -> bool:
    """Whether ``tile`` takes ``weight`` and this machine's kernel multiplies it faster so: 4-bit, whole
    tiles of rows, an AVX-512 build (about 1.4x faster there: a block's scale applies to 16 rows at once)."""
    if weight.fmt != "q4" or weight.tiled or weight.shape[0] % TILE:
        return False
    try:
        return bool(load_library().fr_quant_can_tile())
    except RuntimeError:
        return False


def tile(weight: QuantWeight) -> QuantWeight:
    """The 4-bit ``weight`` [n, k] (n a multiple of 16) in tiles of 16 rows: q [n / 16, k / 32, 16, 16]
    (tile, block, byte of the block, row) and d, m [n / 16, k / 32, 16]; the same bytes, read by the
    kernel 16 rows at a time."""
    n, k = weight.shape
    check(weight.fmt == "q4" and not weight.tiled and n % TILE == 0, "tile",
          f"only an untiled q4 weight with a multiple of {TILE} rows can be tiled, got {weight.fmt} {weight.shape}")  # fmt: skip
    blocks = k // BLOCK
    q = weight.q.reshape(n // TILE, TILE, blocks, BLOCK // 2).permute(0, 2, 3, 1).contiguous()
    d, m = (t.reshape(n // TILE, TILE, blocks).transpose(1, 2).contiguous() for t in (weight.d, weight.m))
    return QuantWeight("q4", q, d, m, (n, k), tiled=True)


def untile(weight: QuantWeight) -> QuantWeight:
    """``weight`` in GGUF's row layout (itself when not tiled)."""
    if not weight.tiled:
        return weight
    n, k = weight.shape
    q = weight.q.permute(0, 3, 1, 2).reshape(n, k // 2).contiguous()
    d, m = (t.transpose(1, 2).reshape(n, k // BLOCK).contiguous() for t in (weight.d, weight.m))
    return QuantWeight("q4", q, d, m, (n, k))


def dequantize(weight: QuantWeight) -> torch.Tensor:
    """The float32 weight [n, k] that ``weight`` stands for."""
    weight = untile(weight)
    n, k = weight.shape
    if weight.fmt == "q8":
        return (weight.q.float().reshape(n, k // BLOCK, BLOCK) * weight.d.float()[..., None]).reshape(n, k)
    packed = weight.q.reshape(n, k // BLOCK, BLOCK // 2)
    q = torch.cat([packed & 0x0F, packed >> 4], dim=-1).float()
    return (q * weight.d.float()[..., None] + weight.m.float()[..., None]).reshape(n, k)


def run_linear(x: torch.Tensor, weight: QuantWeight) -> torch.Tensor:
    """``x`` [m, k] float32, contiguous, on the CPU, times ``weight`` [n, k]: [m, n] float32 (see the module
    docstring). Unchecked: the caller made sure of the input (a decode step calls it ~200 times)."""
    lib = _library or load_library()
    m, n = x.shape[0], weight.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    status = m and lib.fr_quant_linear(8 if weight.fmt == "q8" else 4, int(weight.tiled), x.data_ptr(), m,
                                       weight.shape[1], weight.q.data_ptr(), weight.d.data_ptr(),
                                       weight.m.data_ptr() if weight.m is not None else None, n, y.data_ptr())  # fmt: skip
    if status == 2:
        raise RuntimeError("quant_linear: this build of the kernel has no tiled 4-bit path (it needs AVX-512)")
    if status:
        raise MemoryError(f"quant_linear: could not allocate the block sums of a [{m}, {weight.shape[1]}] input")
    return y


def kernel_folder() -> Path:
    """Where the compiled kernel is kept: ``$FUSIONRAG_CACHE/kernels`` or ``~/.cache/fusionrag_llm/kernels``."""
    base = os.environ.get("FUSIONRAG_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fusionrag_llm"
    return Path(base).expanduser() / "kernels"


def load_library(folder: Path | None = None) -> ctypes.CDLL:
    """The compiled kernel, built on first use (a second of compiling); ``RuntimeError`` if it cannot be."""
    global _library, _library_error
    if _library is not None:
        return _library
    if _library_error is not None:
        raise RuntimeError(_library_error)
    try:
        _library = _open(_build(folder or kernel_folder()))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        _library_error = f"the quantized CPU kernel could not be built or loaded: {exc}"
        raise RuntimeError(_library_error) from exc
    return _library


def _build(folder: Path) -> Path:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    digest = hashlib.sha256((_SOURCE + " ".join(_FLAGS) + compiler).encode()).hexdigest()[:16]
    target = folder / f"cpu_quant_{digest}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        source = Path(tmp) / "cpu_quant.c"
        source.write_text(_SOURCE)
        built = Path(tmp) / "cpu_quant.so"
        result = subprocess.run([compiler, *_FLAGS, str(source), "-o", str(built), "-lm"],
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
        os.replace(built, target)  # atomic: a concurrent build of the same source wins either way
    logger.info("built the quantized CPU kernel at %s", target)
    return target


def _open(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.fr_quant_linear.restype = ctypes.c_int
    lib.fr_quant_linear.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]  # fmt: skip
    lib.fr_quant_can_tile.restype = ctypes.c_int
    lib.fr_quant_has_avx2.restype = ctypes.c_int
    lib.fr_quantize.restype = ctypes.c_int
    lib.fr_quantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float]  # fmt: skip
    lib.fr_rotate_rows.restype = None
    lib.fr_rotate_rows.argtypes = [ctypes.c_void_p, *[ctypes.c_int64] * 5, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]  # fmt: skip
    lib.fr_attend_prefix.restype = ctypes.c_int
    lib.fr_attend_prefix.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int64, ctypes.c_void_p, *[ctypes.c_int64] * 4, ctypes.c_void_p,
                                     ctypes.c_int64, ctypes.c_int64]  # fmt: skip
    lib.fr_decode_layers.restype = ctypes.c_int
    lib.fr_decode_layers.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
    return lib


__all__ = ["BLOCK", "FORMATS", "TILE", "QuantWeight", "can_tile", "dequantize", "kernel_folder", "load_library",
           "native_library", "holds_exactly", "quantize", "quantize_exact", "quantize_ref", "run_linear", "tile", "untile"]  # fmt: skip
