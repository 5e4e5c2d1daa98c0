"""``fusionrag serve`` builds the engine its options ask for, then hands it to the server (the server
itself is tested through real clients elsewhere; here it is replaced by a recorder)."""

import pytest
from click.testing import CliRunner

import fusionrag_llm.server
from fusionrag_llm.cli.main import cli


@pytest.mark.parametrize(("flags", "expected"), [((), False), (("--engine-option", "layerwise_load=true"), True),
                                                 (("--engine-option", "layerwise_load=false"), False)])  # fmt: skip
def test_serve_passes_its_engine_options(monkeypatch, tmp_path, flags, expected):
    served = {}
    monkeypatch.setattr(fusionrag_llm.server, "serve", lambda rag, **kw: served.update(rag=rag, **kw))
    result = CliRunner().invoke(cli, ["serve", "--model", "tiny", "--device", "cpu", "--store", str(tmp_path / "kv"),
                                      "--port", "8123", "--engine-option", "craft_variants=2", *flags])  # fmt: skip
    assert result.exit_code == 0, result.output
    engine = served["rag"].engine
    assert engine.layerwise_load is expected and engine.variants is not None and served["port"] == 8123


def test_a_bad_engine_option_is_refused_with_the_known_ones(monkeypatch, tmp_path):
    monkeypatch.setattr(fusionrag_llm.server, "serve", lambda rag, **kw: None)
    base = ["serve", "--model", "tiny", "--device", "cpu", "--store", str(tmp_path / "kv")]
    unknown = CliRunner().invoke(cli, [*base, "--engine-option", "turbo=1"])
    assert unknown.exit_code != 0 and "unknown engine option(s) turbo; known: kernels" in unknown.output
    shapeless = CliRunner().invoke(cli, [*base, "--engine-option", "craft_variants"])
    assert shapeless.exit_code != 0 and "is not KEY=VALUE" in shapeless.output
