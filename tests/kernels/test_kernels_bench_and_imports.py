"""The benchmark's CPU smoke run, and importing the kernel modules without triton."""

import json
import subprocess
import sys

import torch
from kernel_cases import needs_triton


@needs_triton
def test_bench_small_smoke(tmp_path):
    from fusionrag_llm.kernels import bench

    out = tmp_path / "bench.json"
    assert bench.main(["--small", "--context", "40", "--fractions", "0.15,1.0", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    methods = [r["method"] for r in result["rows"]]
    assert methods.count("q_sparse_attention") == 2 and "sdpa_causal_full" in methods
    sparse = [r for r in result["rows"] if r["method"] == "q_sparse_attention"]
    assert all(r["max_abs_diff_vs_sdpa"] < 1e-4 for r in sparse)
    against_ref = {r["method"]: r for r in result["rows"] if "max_abs_diff_vs_ref" in r}
    assert set(against_ref) == {"q_sparse_attention_varlen", "apply_rotary", "critical_scores", "quant_linear_q8",
                                "quant_linear_q4"}  # fmt: skip
    assert all(r["max_abs_diff_vs_ref"] < 1e-3 for r in against_ref.values())
    assert {f"{name}_ref" for name in against_ref} <= set(methods)


# kernel module -> (its launcher; whether the module holds the @triton.jit kernel itself)
KERNEL_MODULES = {
    "q_sparse_attention": ("q_sparse_attention", True),
    "q_sparse_attention_varlen": ("q_sparse_attention_varlen", False),  # q_sparse_attention's kernel, packed
    "rotary": ("apply_rotary", True),
    "critical_scores": ("critical_scores", True),
    "cpu_quant": ("linear", False),  # a C kernel, compiled on first use
}


def test_every_kernel_module_has_kernel_launcher_reference_and_benchmark():
    import importlib
    import inspect

    from fusionrag_llm.kernels import bench

    for module_name, (launcher, has_kernel) in KERNEL_MODULES.items():
        module = importlib.import_module(f"fusionrag_llm.kernels.{module_name}")
        assert ("@triton.jit" in inspect.getsource(module)) == has_kernel, module_name
        assert callable(getattr(module, launcher)) and callable(getattr(module, f"{launcher}_ref")), module_name
        assert module_name == "q_sparse_attention" or module_name in bench.KERNEL_BENCHES, module_name


def test_bench_refuses_cpu_without_small(capsys):
    if torch.cuda.is_available():
        return
    from fusionrag_llm.kernels import bench

    assert bench.main([]) == 2
    assert "needs a GPU" in capsys.readouterr().err


def test_modules_import_and_references_work_without_triton():
    code = """
import sys
sys.modules["triton"] = None  # makes `import triton` fail
import torch
from fusionrag_llm.kernels import dispatch, q_sparse_attention as m, rotary, critical_scores
q, k = torch.randn(2, 3, 16), torch.randn(1, 5, 16)
pos = torch.arange(5)
out = dispatch.q_sparse_attention(q, pos[:3], k, k, pos, None, backend=None)
assert out.shape == q.shape and dispatch.resolve_backend(q) == "torch"
try:
    m.q_sparse_attention(q, pos[:3], k, k, pos, None)
except RuntimeError as exc:
    assert "triton is not importable" in str(exc)
else:
    raise SystemExit("launcher did not refuse")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
