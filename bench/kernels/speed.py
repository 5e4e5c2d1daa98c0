"""Benchmark every kernel: Q-sparse attention against SDPA, and each kernel against its torch reference.

    python bench/kernels/speed.py [--out DIR] [--context 32768] [--fractions ...]
    python bench/kernels/speed.py --small      # CPU smoke run (Triton interpreter)

For each recompute fraction f the recompute set R is ``round(f * context)`` random context
positions, the queries; their fresh K/V are written over their context entries (the FusionRAG
prefill layout: the keys are the cache). Compared, per fraction: the Triton kernel; SDPA of the same
queries over the context with a materialised ``[|R|, context]`` mask (mask construction timed
separately); and, once, full causal SDPA over all ``context`` tokens (what Full Attention pays).
TFLOP/s count the useful work only (4 * D * Hq per visible query-key pair); GB/s count the
algorithmic bytes (each input read once, output written once), so both are lower bounds on what
the hardware moved.

One entry per kernel module (``KERNEL_BENCHES``): ``q_sparse_attention`` (above),
``q_sparse_attention_varlen`` (``q_sparse_attention_spans``, batched decode: one query per request
over its span of the keys, its keys cut into ranges and whole), ``apply_rotary``, ``critical_scores`` and
``elementwise`` (RMSNorm, alone and after a residual add, and SwiGLU of one decode row and of a context's rows), each timed against its torch
reference on the same inputs with their max difference, and ``cpu_quant`` (a decode row through the
8-bit and 4-bit CPU linear, on the CPU, against the float64 product of the dequantized weight; and
the weights' quantization, compiled against the torch reference).
A new kernel adds its entry there. Writes ``kernels.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

FULL = {"context": 32768, "heads_q": 32, "heads_kv": 8, "head_dim": 128, "dtype": "bfloat16"}
SMALL = {"context": 96, "heads_q": 4, "heads_kv": 2, "head_dim": 32, "dtype": "float32"}
FRACTIONS = (0.05, 0.15, 0.3, 1.0)

# the CI smoke run (tests/bench/test_lab_scripts.py adds --out)
TINY_ARGS = ["--small", "--context", "40", "--fractions", "0.15,1.0"]

def build_inputs(shape: dict, fraction: float, device: str, seed: int = 0) -> dict:
    """FusionRAG prefill layout: context [Hkv, N, D] holding R's fresh K/V, R = recompute positions (queries)."""
    g = torch.Generator().manual_seed(seed)
    n, hq, hkv, d = shape["context"], shape["heads_q"], shape["heads_kv"], shape["head_dim"]
    dtype = getattr(torch, shape["dtype"])
    nq = max(1, round(fraction * n))
    recompute = torch.randperm(n, generator=g)[:nq].sort().values

    def rnd(*s):
        return torch.randn(*s, generator=g).to(device=device, dtype=dtype)

    return {"q": rnd(hq, nq, d), "q_positions": recompute.to(device), "k": rnd(hkv, n, d),
            "v": rnd(hkv, n, d), "k_positions": torch.arange(n, device=device),
            "k_valid": torch.ones(n, dtype=torch.bool, device=device)}


def visible_pairs(inp: dict) -> int:
    """Number of (query, key) pairs the rule makes visible."""
    keys = inp["k_positions"][inp["k_valid"]].sort().values
    return int(torch.searchsorted(keys, inp["q_positions"], right=True).sum())


def masked_sdpa(inp: dict):
    """SDPA over the context with an explicit boolean mask; returns (call, mask build seconds)."""
    t0 = time.perf_counter()
    mask = inp["k_valid"][None, :] & (inp["k_positions"][None, :] <= inp["q_positions"][:, None])  # [Nq, N]
    _sync(inp["q"].device)
    build_s = time.perf_counter() - t0
    group = inp["q"].shape[0] // inp["k"].shape[0]
    k = inp["k"].repeat_interleave(group, 0)[None]
    v = inp["v"].repeat_interleave(group, 0)[None]
    q = inp["q"][None]
    return (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None])[0]), build_s


def causal_sdpa(shape: dict, device: str):
    """Full Attention: causal SDPA of all context tokens (KV heads repeated for GQA)."""
    n, hq, d = shape["context"], shape["heads_q"], shape["head_dim"]
    dtype = getattr(torch, shape["dtype"])
    q = torch.randn(1, hq, n, d, device=device, dtype=dtype)
    k, v = torch.randn_like(q), torch.randn_like(q)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_call(fn, device: str, reps: int) -> float:
    """Median seconds of ``fn`` (triton's do_bench on CUDA, wall clock on CPU)."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=10, rep=max(reps, 20), return_mode="median") / 1e3
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _bytes(inp: dict, kv_heads_read: int) -> int:
    es = inp["q"].element_size()
    hq, nq, d = inp["q"].shape
    n = inp["k"].shape[1]
    return es * (2 * hq * nq * d + 2 * kv_heads_read * n * d) + 9 * n + 16 * nq


def _row(method, fraction, nq, seconds, flops, nbytes, **extra) -> dict:
    ok = seconds is not None
    return {"method": method, "fraction": fraction, "queries": nq, "ms": seconds * 1e3 if ok else None,
            "tflops": flops / seconds / 1e12 if ok else None,
            "gbps": nbytes / seconds / 1e9 if ok else None, **extra}


def _attempt(fn, device, reps):
    try:
        return time_call(fn, device, reps), None
    except torch.cuda.OutOfMemoryError as exc:  # the masked baseline can exhaust memory at 32k
        torch.cuda.empty_cache()
        return None, f"out of memory: {str(exc).splitlines()[0]}"


def bench_fraction(shape: dict, fraction: float, device: str, reps: int) -> list[dict]:
    """Rows for one recompute fraction: the Triton kernel and masked SDPA (+ their max difference)."""
    from fusionrag_llm.kernels.q_sparse_attention import q_sparse_attention

    inp = build_inputs(shape, fraction, device)
    hq, nq, d = inp["q"].shape
    flops = 4 * d * hq * visible_pairs(inp)
    args = [inp[k] for k in ("q", "q_positions", "k", "v", "k_positions", "k_valid")]

    def sparse():
        return q_sparse_attention(*args)

    t_sparse, err_sparse = _attempt(sparse, device, reps)
    rows = [_row("q_sparse_attention", fraction, nq, t_sparse, flops,
                 _bytes(inp, inp["k"].shape[0]), error=err_sparse)]
    try:
        dense, build_s = masked_sdpa(inp)
        diff = (sparse().float() - dense().float()).abs().max().item()
        t_dense, err = _attempt(dense, device, reps)
    except torch.cuda.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        t_dense, build_s, diff, err = None, None, None, f"out of memory: {str(exc).splitlines()[0]}"
    rows[0]["max_abs_diff_vs_sdpa"] = diff
    mask_bytes = nq * inp["k"].shape[1]
    rows.append(_row("sdpa_bool_mask", fraction, nq, t_dense, flops, _bytes(inp, hq) + mask_bytes,
                     mask_build_ms=None if build_s is None else build_s * 1e3, error=err))
    return rows


def _rand(g, shape: dict, device: str, *size):
    return torch.randn(*size, generator=g).to(device=device, dtype=getattr(torch, shape["dtype"]))


def _kernel_vs_ref(name, kernel, reference, fraction, queries, flops, nbytes, device, reps) -> list[dict]:
    """Rows for a kernel and its torch reference on the same inputs (+ their max difference)."""
    t_kernel, err_kernel = _attempt(kernel, device, reps)
    t_ref, err_ref = _attempt(reference, device, reps)
    diff = (kernel().float() - reference().float()).abs().max().item() if err_kernel is None else None
    return [_row(name, fraction, queries, t_kernel, flops, nbytes, error=err_kernel, max_abs_diff_vs_ref=diff),
            _row(f"{name}_ref", fraction, queries, t_ref, flops, nbytes, error=err_ref)]


def bench_rotary(shape: dict, device: str, reps: int) -> list[dict]:
    """Rotary embedding of a whole context's position-free keys at arbitrary positions."""
    from fusionrag_llm.kernels.rotary import apply_rotary, apply_rotary_ref

    g = torch.Generator().manual_seed(1)
    n, hkv, d = shape["context"], shape["heads_kv"], shape["head_dim"]
    x = _rand(g, shape, device, hkv, n, d)
    positions = torch.randperm(4 * n, generator=g)[:n].to(device)
    inv_freq = (10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)).to(device)
    args = (x, positions, inv_freq)
    return _kernel_vs_ref("apply_rotary", lambda: apply_rotary(*args), lambda: apply_rotary_ref(*args), 1.0, n,
                          3 * hkv * n * d, 2 * x.element_size() * x.numel() + 8 * n, device, reps)  # fmt: skip


def bench_elementwise(shape: dict, device: str, reps: int) -> list[dict]:
    """RMSNorm (alone and after a residual add) and SwiGLU (``silu(gate) * up``) of one decode row and of a whole context's rows, at the
    shape's hidden size (heads x head dim; SwiGLU at 3.5 times it, Llama-3-8B's ratio)."""
    from fusionrag_llm.kernels.elementwise import (add_rms_norm, add_rms_norm_ref, rms_norm, rms_norm_ref, silu_mul,
                                                   silu_mul_ref)  # fmt: skip

    g = torch.Generator().manual_seed(3)
    hidden = shape["heads_q"] * shape["head_dim"]
    inner = hidden * 7 // 2
    weight = _rand(g, shape, device, hidden)
    rows = []
    for n in (1, shape["context"]):
        x, fused = _rand(g, shape, device, n, hidden), _rand(g, shape, device, n, 2 * inner)
        gate, up = fused[:, :inner], fused[:, inner:]
        rows += _kernel_vs_ref(f"rms_norm_{n}rows", lambda x=x: rms_norm(x, weight, 1e-5),
                               lambda x=x: rms_norm_ref(x, weight, 1e-5), 1.0, n, 4 * n * hidden,
                               2 * x.element_size() * x.numel(), device, reps)  # fmt: skip
        rows += _kernel_vs_ref(f"add_rms_norm_{n}rows", lambda x=x: add_rms_norm(x, x, weight, 1e-5)[1],
                               lambda x=x: add_rms_norm_ref(x, x, weight, 1e-5)[1], 1.0, n, 5 * n * hidden,
                               4 * x.element_size() * x.numel(), device, reps)  # fmt: skip
        rows += _kernel_vs_ref(f"silu_mul_{n}rows", lambda gate=gate, up=up: silu_mul(gate, up),
                               lambda gate=gate, up=up: silu_mul_ref(gate, up), 1.0, n, 5 * n * inner,
                               3 * gate.element_size() * gate.numel(), device, reps)  # fmt: skip
    return rows


def bench_critical_scores(shape: dict, device: str, reps: int) -> list[dict]:
    """Question-to-context attention column sums: the last 32 tokens over the whole context."""
    from fusionrag_llm.kernels.critical_scores import critical_scores, critical_scores_ref

    g = torch.Generator().manual_seed(2)
    n, hq, hkv, d = shape["context"], shape["heads_q"], shape["heads_kv"], shape["head_dim"]
    nq = min(32, n)
    q, k = _rand(g, shape, device, hq, nq, d), _rand(g, shape, device, hkv, n, d)
    args = (q, torch.arange(n - nq, n, device=device), k, torch.arange(n, device=device),
            torch.ones(n, dtype=torch.bool, device=device))  # fmt: skip
    return _kernel_vs_ref("critical_scores", lambda: critical_scores(*args), lambda: critical_scores_ref(*args),
                          nq / n, nq, 4 * d * hq * nq * n, q.element_size() * (q.numel() + k.numel()) + 4 * n,
                          device, reps)  # fmt: skip


def bench_spans_decode(shape: dict, device: str, reps: int) -> list[dict]:
    """Batched decode: 1 and 4 requests, one query each, over their own span of the keys; the keys of a
    request cut into ranges as ``split_count`` chooses (``_split``) and read by one program (``_whole``)."""
    from fusionrag_llm.eval.gpu_checks import decode_span_args
    from fusionrag_llm.kernels.q_sparse_attention_varlen import q_sparse_attention_spans, q_sparse_attention_spans_ref

    g = torch.Generator().manual_seed(3)
    n, hq, hkv, d = shape["context"], shape["heads_q"], shape["heads_kv"], shape["head_dim"]
    rows = []
    for requests in (1, 4):
        per = max(1, n // requests)
        args = decode_span_args(requests, per, hq, hkv, d, device, getattr(torch, shape["dtype"]), g)
        q, k = args[0], args[3]
        reference = lambda args=args: q_sparse_attention_spans_ref(*args)  # noqa: E731
        for label, splits in (("split", None), ("whole", 1)):
            kernel = lambda args=args, splits=splits: q_sparse_attention_spans(*args, splits=splits)  # noqa: E731
            rows += _kernel_vs_ref(f"q_sparse_attention_spans_{requests}req_{label}", kernel, reference, 1 / per,
                                   requests, 4 * d * hq * requests * per, q.element_size() * 2 * k.numel(), device,
                                   reps)  # fmt: skip
    return rows


def quant_linear_ref(x: torch.Tensor, weight) -> torch.Tensor:
    """The rows times the dequantized weight, in float64: what the CPU kernel computes, summed exactly."""
    from fusionrag_llm.kernels import cpu_quant

    return (x.double() @ cpu_quant.dequantize(weight).double().T).float()


def bench_cpu_quant(shape: dict, device: str, reps: int) -> list[dict]:
    """Block-quantized CPU linear of one decode row (always on the CPU): q8 and q4 against the reference."""
    from fusionrag_llm.kernels import cpu_quant

    try:
        cpu_quant.load_library()
    except RuntimeError:
        return [_row("quant_linear", 1.0, 1, None, 0, 0, error="the CPU kernel could not be built here")]
    g = torch.Generator().manual_seed(4)
    n, k = 4 * shape["heads_q"] * shape["head_dim"], shape["heads_q"] * shape["head_dim"]  # an MLP up-projection
    k -= k % cpu_quant.BLOCK
    x, weight = torch.randn(1, k, generator=g), torch.randn(n, k, generator=g)
    rows = []
    for fmt in cpu_quant.FORMATS:
        qw = cpu_quant.quantize(weight, fmt)
        rows += _kernel_vs_ref(f"quant_linear_{fmt}", lambda qw=qw: cpu_quant.run_linear(x, qw),
                               lambda qw=qw: quant_linear_ref(x, qw), 1.0, 1, 2 * n * k, qw.nbytes, "cpu", reps)  # fmt: skip
        # what loading a model does to each linear weight: its blocks, in one pass (the levels compared)
        rows += _kernel_vs_ref(f"quantize_{fmt}", lambda fmt=fmt: cpu_quant.quantize(weight, fmt).q,
                               lambda fmt=fmt: cpu_quant.quantize_ref(weight, fmt).q, 1.0, 1, 0,
                               4 * n * k + qw.nbytes, "cpu", reps)  # fmt: skip
    return rows


# kernel module -> its benchmark beyond the SDPA comparison (q_sparse_attention's is bench_fraction)
KERNEL_BENCHES = {
    "q_sparse_attention_varlen": bench_spans_decode,
    "rotary": bench_rotary,
    "critical_scores": bench_critical_scores,
    "elementwise": bench_elementwise,
    "cpu_quant": bench_cpu_quant,
}


def run(shape: dict, fractions, device: str, reps: int) -> dict:
    """All rows plus the Full Attention reference; speedups are relative to causal SDPA."""
    n, hq, d = shape["context"], shape["heads_q"], shape["head_dim"]
    t_full, err = _attempt(causal_sdpa(shape, device), device, reps)
    es = torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()
    rows = [_row("sdpa_causal_full", 1.0, n, t_full, 4 * d * hq * n * (n + 1) // 2,
                 4 * es * hq * n * d, error=err)]
    for fraction in fractions:
        rows += bench_fraction(shape, fraction, device, reps)
    for bench_kernel in KERNEL_BENCHES.values():
        rows += bench_kernel(shape, device, reps)
    for row in rows:
        ok = t_full is not None and row["ms"] is not None
        row["speedup_vs_full"] = t_full * 1e3 / row["ms"] if ok else None
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu (triton interpreter)"
    return {"device": gpu, "shape": shape, "torch": torch.__version__, "rows": rows}


def format_table(result: dict) -> str:
    """Fixed-width text table of the rows."""
    head = (f"{'method':<30} {'frac':>5} {'queries':>8} {'ms':>10} {'TFLOP/s':>8} {'GB/s':>8} "
            f"{'vs full':>8} {'max|diff|':>9}")
    lines = [f"device: {result['device']}  shape: {result['shape']}", head, "-" * len(head)]

    def fmt(x, spec):
        return format(x, spec) if x is not None else "-"

    for r in result["rows"]:
        lines.append(f"{r['method']:<30} {r['fraction']:>5.2f} {r['queries']:>8} {fmt(r['ms'], '>10.3f')} "
                     f"{fmt(r['tflops'], '>8.2f')} {fmt(r['gbps'], '>8.1f')} "
                     f"{fmt(r['speedup_vs_full'], '>7.2f')}x "
                     f"{fmt(r.get('max_abs_diff_vs_sdpa', r.get('max_abs_diff_vs_ref')), '>9.1e')}"
                     + (f"  ({r['error']})" if r.get("error") else ""))
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python bench/kernels/speed.py", description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="tiny sizes; allowed on CPU (smoke run)")
    p.add_argument("--out", default="bench_out", help="folder for kernels.json")
    p.add_argument("--context", type=int, help="context length (default 32768, or 96 with --small)")
    p.add_argument("--fractions", default=",".join(map(str, FRACTIONS)), help="comma-separated")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions (default 50, 1 with --small)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Run the benchmark; returns a process exit code (2 when refused)."""
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.small:
        sys.stderr.write("speed.py: no CUDA device; the benchmark needs a GPU "
                         "(use --small for a CPU smoke run under the Triton interpreter)\n")
        return 2
    shape = dict(SMALL if args.small else FULL)
    if args.context:
        shape["context"] = args.context
    reps = args.reps or (1 if args.small else 50)
    result = run(shape, [float(f) for f in args.fractions.split(",")], device, reps)
    out = Path(args.out) / "kernels.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    sys.stdout.write(format_table(result) + f"\nwrote {out}\n")
    return 0


def _reexec_under_interpreter(argv) -> None:
    """A CPU smoke run needs TRITON_INTERPRET=1 before triton decorates the kernels."""
    if not torch.cuda.is_available() and "--small" in argv and os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, __file__, *argv])


if __name__ == "__main__":
    _reexec_under_interpreter(sys.argv[1:])
    sys.exit(main(sys.argv[1:]))
