from click.testing import CliRunner

from fusionrag_llm.cli.main import cli


def test_demo_runs_on_tiny_model():
    result = CliRunner().invoke(cli, ["demo", "--model", "tiny", "--max-new-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert result.output.count("Q: ") == 3 and "TTFT" in result.output
    assert result.output.count("fusionrag ") == 3 and "8 fused entries computed" in result.output


def test_unknown_model_is_a_clean_cli_error():
    result = CliRunner().invoke(cli, ["demo", "--model", "nope"])
    assert result.exit_code != 0
    assert "unknown model 'nope'" in result.output and "Traceback" not in result.output
