from click.testing import CliRunner

from fusionrag_llm.cli.main import cli


def test_demo_runs_on_tiny_model():
    result = CliRunner().invoke(cli, ["demo", "--model", "tiny", "--max-new-tokens", "4", "--distractors", "4", "--repeats", "2"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.count("Q: ") == 3 and "TTFT ms" in out and "12 fused entries computed" in out
    # tiny has no GGUF file: llama.cpp is skipped with the reason (or because it is not installed)
    assert "llama.cpp: skipped" in out
    assert "ingesting 12 passages" in out and "TTFT: the median of 2 runs of each method" in out
    # the summary's rows; a note on a busy machine may follow them
    summary = [line for line in out[out.index("Summary") :].splitlines()[1:] if line.strip() and not line.startswith("note:")]
    assert [line.split()[0] for line in summary] == ["full_attention", "full_reuse", "cacheblend", "fusionrag_paper", "fusionrag"]
    assert "3/3 answers" in summary[0]  # full attention is its own reference
    assert "it/s" not in out  # quiet by default: no progress bars


def test_demo_prompts_grow_with_distractors():
    from fusionrag_llm.cli.demo import distractor_passages

    ten = distractor_passages(10)
    assert len(ten) == 10 and distractor_passages(25)[:10] == ten and distractor_passages(0) == []
    assert all(len(p.split()) >= 100 for p in ten)


def test_unknown_model_is_a_clean_cli_error():
    result = CliRunner().invoke(cli, ["demo", "--model", "nope"])
    assert result.exit_code != 0
    assert "unknown model 'nope'" in result.output and "Traceback" not in result.output
