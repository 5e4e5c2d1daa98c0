"""``fusionrag bench ttft`` and ``fusionrag bench decode`` end to end on the tiny model."""

import json
import math

from click.testing import CliRunner

from fusionrag_llm.cli.main import cli


def _invoke(args):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


def test_ttft(tmp_path):
    _invoke(["bench", "ttft", "--dataset", "synthetic", "--lengths", "200,700", "--method", "fusionrag,cacheblend",
             "--ratio", "0.15", "--model", "tiny", "--repeats", "1", "--neighbors", "2",
             "--baselines", "transformers,llama_cpp", "--max-new-tokens", "4", "--out", str(tmp_path)])  # fmt: skip
    data = json.loads((tmp_path / "ttft.json").read_text())
    markdown = (tmp_path / "ttft.md").read_text()
    assert (tmp_path / "ttft.png").read_bytes()[:4] == b"\x89PNG" and "vs HF" in markdown
    # tiny has no GGUF file: llama.cpp is skipped with the reason, whether or not it is installed
    assert "llama.cpp: skipped" in markdown and "## End to end: TTFT + 4 tokens" in markdown
    assert data["offline"]["chunks"] > 0 and data["offline"]["evicted"] == 0
    rows = {(r["length"], r["label"]): r for r in data["rows"]}
    labels = {"full_attention", "full_reuse", "fusionrag@0.15", "cacheblend@0.15", "transformers"}
    assert set(rows) == {(n, label) for n in (200, 700) for label in labels}
    assert rows[(200, "full_attention")]["prompt_tokens"] < rows[(700, "full_attention")]["prompt_tokens"]
    for (length, label), row in rows.items():
        assert row["ttft_s"] > 0 and len(row["ttft_repeats_s"]) == 1
        assert math.isclose(row["speedup_vs_fa"], rows[(length, "full_attention")]["ttft_s"] / row["ttft_s"])
        assert math.isclose(row["speedup_vs_hf"], rows[(length, "transformers")]["ttft_s"] / row["ttft_s"])
        assert row["ttft_s"] < row["e2e_s"]  # 3 more tokens decoded after the first
        assert row["speedup_vs_llama_cpp"] is None  # no llama.cpp row (NaN is written as null)
        if label != "transformers":
            assert row["load_s"] + row["select_s"] + row["prefill_s"] <= row["ttft_s"] * 1.001
    assert rows[(700, "fusionrag@0.15")]["recomputed_tokens"] > 0
    # the HF twin is the same model: its greedy first token is the engine's Full Attention one
    assert all(rows[(n, "transformers")]["first_token_matches_engine"] for n in (200, 700))


def test_ttft_length_beyond_the_window_is_a_clean_error(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "ttft", "--dataset", "synthetic", "--lengths", "5000", "--model", "tiny",
                                      "--baselines", "none", "--out", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 1 and "context window of 4096" in result.output


def test_ttft_refuses_an_unknown_baseline(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "ttft", "--model", "tiny", "--baselines", "transformers,vllm"])
    assert result.exit_code == 2 and "transformers, llama_cpp" in result.output


def test_decode(tmp_path):
    from fusionrag_llm.kernels import cpu_quant

    try:
        cpu_quant.load_library()
        kernel = True
    except RuntimeError:
        kernel = False
    formats = "float+layers,float,q8,q4,q4+layers" if kernel else "float+layers,float"
    _invoke(["bench", "decode", "--dataset", "synthetic", "--model", "tiny", "--formats", formats, "--lengths", "400,1200",
             "--speed-tokens", "6", "--questions", "2", "--passages", "3", "--max-new-tokens", "5", "--out", str(tmp_path)])  # fmt: skip
    data = json.loads((tmp_path / "decode.json").read_text())
    markdown = (tmp_path / "decode.md").read_text()
    assert ("q8 vs float" in markdown or not kernel) and "llama.cpp: skipped" in markdown
    assert [r["target_tokens"] for r in data["speed"]] == [400, 1200]
    assert data["speed"][0]["prompt_tokens"] < data["speed"][1]["prompt_tokens"]
    assert all(r["tokens_per_s"][f] > 0 for r in data["speed"] for f in formats.split(","))
    assert len(data["fidelity"]) == 2
    reference = formats.split(",")[0]  # the reference's own computation: float weights, layer by layer
    for row in data["fidelity"]:
        float_row = row["formats"][reference]
        assert float_row["same_answer"] and float_row["kl_max"] == 0.0 and float_row["top1_agreement"] == 1.0
        if kernel:  # the compiled step over the float weights: the same sums in another order
            assert row["formats"]["float"]["kl_max"] < 1e-6 and row["formats"]["float"]["top1_agreement"] == 1.0
        for fmt in [f for f in formats.split(",") if f not in (reference, "float")]:  # random weights are not on the
            # 8/4-bit grids: close, not equal
            assert 0.0 < row["formats"][fmt]["kl_mean"] < 0.5
    assert data["summary"][reference]["same_answer"] == 2
    if kernel:  # the compiled step and the layer-by-layer one: the same sums in another order
        for row in data["fidelity"]:
            compiled, layers = row["formats"]["q4"], row["formats"]["q4+layers"]
            assert abs(compiled["kl_mean"] - layers["kl_mean"]) < 1e-3 * layers["kl_mean"] + 1e-7


def test_decode_refuses_an_unknown_format(tmp_path):
    for bad in ("q3", "q4/float16", "q4+compiled"):
        result = CliRunner().invoke(cli, ["bench", "decode", "--dataset", "synthetic", "--model", "tiny", "--formats", bad])
        assert result.exit_code == 2 and "float, q8, q4" in result.output and "+layers" in result.output
