"""``fusionrag serve`` builds the engine its options ask for, then hands it to the server (the server
itself is tested through real clients elsewhere; here it is replaced by a recorder)."""

import pytest
from click.testing import CliRunner

import fusionrag_llm.server
from fusionrag_llm.cli.main import cli


@pytest.mark.parametrize(("flags", "expected"), [((), False), (("--layerwise-load",), True),
                                                 (("--no-layerwise-load",), False)])  # fmt: skip
def test_serve_passes_its_engine_options(monkeypatch, tmp_path, flags, expected):
    served = {}
    monkeypatch.setattr(fusionrag_llm.server, "serve", lambda rag, **kw: served.update(rag=rag, **kw))
    result = CliRunner().invoke(cli, ["serve", "--model", "tiny", "--device", "cpu", "--store", str(tmp_path / "kv"),
                                      "--port", "8123", "--craft-variants", "2", *flags])  # fmt: skip
    assert result.exit_code == 0, result.output
    engine = served["rag"].engine
    assert engine.layerwise_load is expected and engine.variants is not None and served["port"] == 8123
