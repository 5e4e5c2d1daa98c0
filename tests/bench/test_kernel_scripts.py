"""The kernel benchmark and tuning sweep: one benchmark entry per kernel, the choice of the fastest
correct tile, and refusing a CPU run that would take hours. Their CPU smoke runs are in
test_lab_scripts.py."""

import importlib
import inspect

import pytest
import torch

# kernel module -> (its launcher; whether the module holds the @triton.jit kernel itself)
KERNEL_MODULES = {
    "q_sparse_attention": ("q_sparse_attention", True),
    "q_sparse_attention_varlen": ("q_sparse_attention_spans", False),  # q_sparse_attention's kernel, batched
    "rotary": ("apply_rotary", True),
    "critical_scores": ("critical_scores", True),
    "cpu_quant": ("run_linear", False),  # a C kernel, compiled on first use; its reference is speed.py's
}


def test_every_kernel_module_has_kernel_launcher_reference_and_benchmark(load_script):
    speed = load_script("kernels/speed.py")
    for module_name, (launcher, has_kernel) in KERNEL_MODULES.items():
        module = importlib.import_module(f"fusionrag_llm.kernels.{module_name}")
        assert ("@triton.jit" in inspect.getsource(module)) == has_kernel, module_name
        reference = speed.quant_linear_ref if module_name == "cpu_quant" else getattr(module, f"{launcher}_ref")
        assert callable(getattr(module, launcher)) and callable(reference), module_name
        # q_sparse_attention's benchmark is the comparison with SDPA that every run makes
        assert module_name == "q_sparse_attention" or module_name in speed.KERNEL_BENCHES, module_name


def test_best_skips_failed_and_untimed_rows(load_script):
    tune = load_script("kernels/tune.py")
    rows = [{"case": "a", "variant": "v", "ok": True, "ms": 2.0, "config": [64, 64, 4, 2]},
            {"case": "a", "variant": "v", "ok": False, "ms": 0.5, "config": [128, 64, 8, 2]},
            {"case": "a", "variant": "v", "ok": False, "error": "skipped: time budget", "config": [16, 64, 4, 2]},
            {"case": "a", "variant": "w", "ok": True, "ms": 1.0, "config": [64, 64, 4, 2]},
            {"case": "a", "variant": "v", "ok": True, "ms": 1.5, "config": [64, 128, 4, 3]}]  # fmt: skip
    assert tune.best(rows, "a", "v")["config"] == [64, 128, 4, 3]
    assert tune.best(rows, "b", "v") is None


def test_dry_run_lists_every_case(load_script, capsys):
    assert load_script("kernels/tune.py").main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(f"prefill f={f:g}" in out for f in (0.05, 0.15, 0.3, 1.0))
    assert "16 queries" in out and "decode" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU run is allowed")
@pytest.mark.parametrize("script", ["kernels/speed.py", "kernels/tune.py"])
def test_a_full_size_run_is_refused_without_a_gpu(load_script, script, capsys):
    assert load_script(script).main([]) == 2
    assert "needs a GPU" in capsys.readouterr().err
