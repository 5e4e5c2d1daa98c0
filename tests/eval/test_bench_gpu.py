"""``fusionrag bench gpu``: layer-wise against whole placement, on a small random-weight model on
the CPU (the numbers that matter come from a GPU; here the run, its files and its errors)."""

import json

import torch
from click.testing import CliRunner

from fusionrag_llm.cli.main import cli
from fusionrag_llm.eval.bench_gpu import chunk_texts, random_model


def test_gpu_bench_writes_both_modes_for_every_context_and_method(tmp_path):
    args = ["bench", "gpu", "--model", "small", "--device", "cpu", "--dtype", "float32", "--lengths", "1024,1536",
            "--tiers", "host", "--repeats", "1", "--out", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "gpu.json").read_text())
    rows = written["rows"]
    assert written["kernels"] == "torch"  # auto on the CPU
    assert [(r["context"], r["method"]) for r in rows] == [(c, m) for c in (1024, 1536) for m in ("full_reuse", "fusionrag")]
    for row in rows:
        whole, layerwise = row["runs"]["whole"], row["runs"]["layerwise"]
        assert len(whole) == len(layerwise) == 1 and row["whole_s"] > 0 and row["layerwise_s"] > 0
        assert whole[0]["reused"] == layerwise[0]["reused"] > 0  # the same request both ways, chunks reused
    assert "| host | 1536 | fusionrag r=0.15 |" in result.output


def test_gpu_bench_refuses_what_it_cannot_measure(tmp_path):
    run = CliRunner().invoke
    out = ["--out", str(tmp_path)]
    assert "needs a CUDA device" in run(cli, ["bench", "gpu", "--model", "small", "--device", "cpu", *out]).output
    assert "host and/or device" in run(cli, ["bench", "gpu", "--tiers", "disk", *out]).output
    cpu = ["bench", "gpu", "--model", "small", "--device", "cpu", "--tiers", "host", *out]
    assert "at least one chunk" in run(cli, [*cpu, "--lengths", "100"]).output
    assert "dtype must be one of bfloat16, float16, float32" in run(cli, [*cpu, "--dtype", "bf16"]).output


def test_random_model_has_the_shape_and_real_numbers():
    loaded = random_model("small", "cpu", torch.float32)
    assert loaded.model.kernels == "torch" and random_model("small", "cpu", torch.float32, kernels="triton").model.kernels == "triton"
    cfg = loaded.model.cfg
    assert (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size) == (4, 2, 64, 256)
    assert all(bool(torch.isfinite(p).all()) for p in loaded.model.parameters())
    texts = chunk_texts(3)
    assert len(texts) == 3 and all(len(loaded.tokenizer.encode(t)) == 512 for t in texts)
