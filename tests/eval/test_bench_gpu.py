"""``fusionrag bench gpu``: every section on a small random-weight model on the CPU (the numbers that
matter come from a GPU; here the run, its files, its summary and its errors)."""

import json

import pytest
import torch
from click.testing import CliRunner

from fusionrag_llm.cli.main import cli
from fusionrag_llm.eval.bench_gpu import SECTIONS, GPUBenchConfig, chunk_texts, random_model, run_gpu_bench

SMALL = {"shape": "small", "device": "cpu", "dtype": "float32", "contexts": (1024,), "repeats": 1}
GPU_TESTS = """import pytest

pytestmark = pytest.mark.gpu


def test_passes():
    pass


def test_fails():
    assert False
"""


@pytest.mark.slow  # every section, and the tests in a subprocess
def test_every_section_writes_its_figures_and_the_tests_their_counts(tmp_path):
    tests_dir = tmp_path / "checkout" / "tests"
    tests_dir.mkdir(parents=True)
    (tests_dir / "test_on_gpu.py").write_text(GPU_TESTS)
    (tests_dir / "test_elsewhere.py").write_text("def test_not_marked():\n    pass\n")
    (tests_dir / "test_needs_more.py").write_text("import a_package_not_installed  # noqa\n")  # an optional dependency
    config = GPUBenchConfig(**SMALL, sections=("all", "layerwise", "tests"), new_tokens=3, batches=(2,), add_chunks=1,
                            tests_dir=tests_dir)  # fmt: skip
    result = run_gpu_bench(config, tmp_path / "out")

    written = json.loads((tmp_path / "out" / "gpu.json").read_text())
    assert set(SECTIONS) | {"header", "figures"} <= set(written)
    assert written["header"]["device"] == "cpu" and written["header"]["torch"] == torch.__version__
    assert written["kv_slots"] == {"host": None}  # no bound on the CPU (a GPU's are recorded as a number)
    assert written["add_chunks"]["chunks"] == 1 and written["add_chunks"]["s"] > 0
    assert [(r["requests"], r["tokens"]) for r in written["decode"]["runs"]] == [(1, 3), (2, 6)]
    assert all(r["decode_tok_s"] > 0 for r in written["decode"]["runs"])
    assert written["decode"]["eager"]["requests"] == 1 and written["decode"]["eager"]["decode_tok_s"] > 0
    shrinking = written["decode"]["shrinking"]  # answers of 1 and 3 new tokens: the batch loses one on the way
    assert (shrinking["requests"], shrinking["shortest"], shrinking["tokens"], shrinking["graphs"]) == (2, 1, 4, 0)
    assert shrinking["graph_memory_pools"] == 0  # no graphs on the CPU
    ttft, layerwise = written["ttft"]["rows"], written["layerwise"]["rows"]
    assert [r["method"] for r in ttft] == [r["method"] for r in layerwise] == ["full_reuse", "fusionrag"]
    assert ttft[1]["runs"]["whole"][0]["reused"] > 0 and ttft[0]["full_attention_s"] > 0
    assert all(r["layerwise_s"] is None for r in ttft) and all(r["layerwise_s"] > 0 for r in layerwise)
    assert set(written["e2e"]["runs"]) == {"fusionrag", "full_attention"} and written["e2e"]["vs_full_attention"] > 0
    attention = written["attention"]["rows"]
    assert [r["fraction"] for r in attention] == [0.05, 0.15, 0.3]
    assert all(r["max_abs_diff"] < 1e-4 and r["flex_ms"] > 0 for r in attention)  # eager FlexAttention agrees
    assert "one recompute path" in written["attention"]["ttft"]["skipped"]  # the torch backend
    decode = written["attention"]["decode"]
    assert [(r["requests"], r["keys"]) for r in decode] == [(1, 1024), (32, 1024)]
    assert all(r["splits"] == 1 and r["max_abs_diff"] == 0 and r["split_ms"] > 0 for r in decode)  # one range on the CPU
    prefill = written["attention"]["prefill"]  # several causal prefills, one by one and in one call: the same outputs
    assert [(r["requests"], r["tokens"]) for r in prefill] == [(4, 1024), (8, 1024), (32, 1024)]
    assert all(r["max_abs_diff"] < 1e-4 and r["each_ms"] > 0 and r["one_call_ms"] > 0 for r in prefill)
    profile = written["profile"]
    assert profile["steps"] == 32  # no kernels to launch, graphs to replay or device operations on the CPU
    assert {name: profile["per_step"][name] for name in ("launches", "graph_launches", "device_ops")} == dict.fromkeys(
        ("launches", "graph_launches", "device_ops"), 0)  # fmt: skip
    assert profile["per_step"]["host_reads"] >= 1  # at least the sampled token is read back each step
    assert profile["decode_ops"] and profile["add_chunks_ops"][0]["self_ms"] > 0
    assert set(profile["ttft"]) == {"fusionrag", "full_reuse"}  # each method's time to the first token, profiled
    assert all(p["wall_ms"] > 0 and p["device_ms"] == 0 and p["ops"] for p in profile["ttft"].values())
    tests = written["tests"]
    assert (tests["passed"], tests["failed"], tests["error"]) == (1, 1, 0)  # the unmarked test deselected
    assert tests["failing"] == ["tests/test_on_gpu.py::test_fails"] and not tests["timed_out"]
    assert tests["uncollected"] == ["tests/test_needs_more.py"]  # the other modules still ran

    figures = {f["key"]: f for f in result["figures"]}
    assert figures["tests"]["met"] == "no" and figures["add_chunks"]["target"].startswith(">= 5x")
    assert figures["decode_1"]["target"] == ">= 150 tok/s" and figures["ttft_fusionrag_1024"]["met"] == "-"
    summary = (tmp_path / "out" / "gpu.md").read_text()
    assert "| figure | measured | target | met |" in summary
    assert "| GPU-marked tests | 1 passed, 1 failed, 0 errors, 1 modules not collected |" in summary
    assert "| TTFT fusionrag r=0.15 from host memory, whole vs layer by layer, 1024 |" in summary
    assert "| TTFT full_reuse profile (1024) | " in summary and ", 0 kernel launches, " in summary


def test_the_command_prints_the_summary_of_the_chosen_sections(tmp_path):
    args = ["bench", "gpu", "--model", "small", "--device", "cpu", "--dtype", "float32", "--lengths", "512",
            "--sections", "ttft", "--repeats", "1", "--out", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "gpu.json").read_text())
    assert "ttft" in written and "decode" not in written
    assert "| TTFT fusionrag r=0.15 vs full_attention, 512 |" in result.output


def test_all_sections_are_the_figures_and_with_cuda_the_tests():
    assert GPUBenchConfig(**SMALL).sections == ("add_chunks", "decode", "ttft", "e2e", "attention", "profile")
    assert GPUBenchConfig(**SMALL, sections=("tests", "all")).sections[-1] == "tests"
    assert GPUBenchConfig(**SMALL, sections=("layerwise", "ttft")).sections == ("ttft", "layerwise")


def test_a_section_past_the_time_budget_is_skipped(tmp_path):
    result = run_gpu_bench(GPUBenchConfig(**SMALL, sections=("decode",), budget_s=0), tmp_path)
    assert (
        result["decode"] == {"skipped": "past the time budget (0 s, tests included)"}
        and result["figures"][0]["figure"] == "decode"
    )


def test_a_failing_section_fails_alone_and_the_command_says_so(tmp_path, monkeypatch):
    import fusionrag_llm.eval.bench_gpu as bench_gpu

    def broken(*args, **kwargs):
        raise RuntimeError("the time-to-first-token run broke\nsecond line")

    monkeypatch.setattr(bench_gpu, "measure", broken)  # what the ttft section times through
    args = ["bench", "gpu", "--model", "small", "--device", "cpu", "--dtype", "float32", "--lengths", "512",
            "--sections", "ttft,decode", "--repeats", "1", "--max-new-tokens", "2", "--concurrency", "2",
            "--out", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(cli, args)

    assert result.exit_code == 1 and f"section(s) ttft failed; the errors are in {tmp_path / 'gpu.json'}" in result.output
    written = json.loads((tmp_path / "gpu.json").read_text())
    assert written["ttft"]["raised"] == "RuntimeError: the time-to-first-token run broke"
    assert "in broken" in written["ttft"]["traceback"]
    assert [r["requests"] for r in written["decode"]["runs"]] == [1, 2]  # the next section still measured
    assert "| ttft | failed: RuntimeError: the time-to-first-token run broke | - | - |" in result.output
    assert "| decode, 1 sequence, 512 context |" in result.output
    assert "raised" not in written["decode"]  # a section that ran is not reported as failed


def test_a_tests_section_with_failing_tests_is_measured_not_raised(tmp_path, monkeypatch):
    """Failing GPU tests are a figure ("no"), not a section that broke: the command still exits 0."""
    import fusionrag_llm.eval.bench_gpu as bench_gpu

    tests_dir = tmp_path / "checkout" / "tests"
    tests_dir.mkdir(parents=True)
    (tests_dir / "test_on_gpu.py").write_text(GPU_TESTS)
    monkeypatch.setattr(bench_gpu, "tests_folder", lambda: tests_dir)
    args = ["bench", "gpu", "--model", "small", "--device", "cpu", "--dtype", "float32", "--lengths", "512",
            "--sections", "tests", "--out", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "| GPU-marked tests | 1 passed, 1 failed, 0 errors | all pass | no |" in result.output


def test_the_tests_of_a_checkout_are_found_beside_an_installed_package(tmp_path, monkeypatch):
    import fusionrag_llm
    from fusionrag_llm.eval.gpu_checks import tests_folder

    monkeypatch.setattr(fusionrag_llm, "__file__", str(tmp_path / "site" / "fusionrag_llm" / "__init__.py"))
    monkeypatch.chdir(tmp_path)
    assert tests_folder() is None  # installed elsewhere, run outside a checkout
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "tests").mkdir()
    assert tests_folder() == tmp_path / "tests"  # run from the checkout


def test_gpu_bench_refuses_what_it_cannot_measure(tmp_path):
    run = CliRunner().invoke
    cpu = ["bench", "gpu", "--model", "small", "--device", "cpu", "--out", str(tmp_path)]
    assert "at least one chunk" in run(cli, [*cpu, "--lengths", "100"]).output
    assert "dtype must be one of bfloat16, float16, float32" in run(cli, [*cpu, "--dtype", "bf16"]).output
    assert "unknown sections gpus" in run(cli, [*cpu, "--sections", "decode,gpus"]).output
    if not torch.cuda.is_available():
        assert "no CUDA device here" in run(cli, ["bench", "gpu", "--out", str(tmp_path)]).output


@pytest.mark.parametrize("kernels", ["auto", "triton"])
def test_random_model_has_the_shape_and_real_numbers(kernels):
    loaded = random_model("small", "cpu", torch.float32, kernels=kernels)
    assert loaded.model.kernels == {"auto": "torch", "triton": "triton"}[kernels]  # auto: torch on the CPU
    cfg = loaded.model.cfg
    assert (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size) == (4, 2, 64, 256)
    assert all(bool(torch.isfinite(p).all()) for p in loaded.model.parameters())
    texts = chunk_texts(3)
    assert len(texts) == 3 and all(len(loaded.tokenizer.encode(t)) == 512 for t in texts)
