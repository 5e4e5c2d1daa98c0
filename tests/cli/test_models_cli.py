"""``fusionrag models list|rm`` over a cache folder of converted models."""

import json

from click.testing import CliRunner

from fusionrag_llm.cli.main import cli


def run(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def test_list_then_remove_converted_models(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSIONRAG_CACHE", str(tmp_path / "cache"))
    assert "no converted models" in run("models", "list").output
    models = tmp_path / "cache" / "models"
    done = models / "gguf-0123456789abcdef"
    done.mkdir(parents=True)
    (done / "model.safetensors").write_bytes(b"x" * 2**20)
    (done / ".fusionrag-complete").write_text(json.dumps({"sha256": "ab" * 32}))
    half = models / "smollm2-135m"
    half.mkdir()
    (half / "config.json").write_text("{}")
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (models / "linked").symlink_to(outside)
    listed = run("models", "list").output
    assert "gguf-0123456789abcdef" in listed and "1.0 MiB  complete (from GGUF sha256 abababababab)" in listed
    assert "smollm2-135m" in listed and "incomplete" in listed and "not a model folder" in listed
    refused = run("models", "rm", "smollm2-135m", input="n\n")
    assert refused.exit_code != 0 and half.is_dir()  # not confirmed: kept
    assert run("models", "rm", "gguf-0123456789abcdef", "linked", "--yes").exit_code == 0
    assert not done.exists() and not (models / "linked").exists() and (outside / "keep.txt").read_text() == "keep"
    for bad, words in [("../precious", "is not a model name"), ("nope", "no converted model 'nope'")]:
        result = CliRunner().invoke(cli, ["models", "rm", bad, "--yes"])
        assert result.exit_code != 0 and words in result.output
    assert outside.is_dir() and half.is_dir()
