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
    assert engine.kv.layerwise is expected and engine.variants is not None and served["port"] == 8123


def test_a_bad_engine_option_is_refused_with_the_known_ones(monkeypatch, tmp_path):
    monkeypatch.setattr(fusionrag_llm.server, "serve", lambda rag, **kw: None)
    base = ["serve", "--model", "tiny", "--device", "cpu", "--store", str(tmp_path / "kv")]
    unknown = CliRunner().invoke(cli, [*base, "--engine-option", "turbo=1"])
    assert unknown.exit_code != 0 and "unknown engine option(s) turbo; known: kernels" in unknown.output
    shapeless = CliRunner().invoke(cli, [*base, "--engine-option", "craft_variants"])
    assert shapeless.exit_code != 0 and "is not KEY=VALUE" in shapeless.output


def test_keys_chunk_writes_and_limits_reach_the_server(monkeypatch, tmp_path):
    served = {}
    monkeypatch.setattr(fusionrag_llm.server, "serve", lambda rag, **kw: served.update(kw))
    base = ["serve", "--model", "tiny", "--device", "cpu", "--store", str(tmp_path / "kv")]
    flags = ["--api-key", "sk-one", "--api-key", "tenant:acme=sk-two", "--api-key", "chunks=sk-admin", "--limit",
             "waiting=8", "--limit", "timeout=2.5", "--limit", "body_mib=0.5"]  # fmt: skip
    result = CliRunner().invoke(cli, [*base, *flags])
    assert result.exit_code == 0, result.output
    assert served["api_keys"] == {"sk-one": None, "sk-two": "acme"} and served["chunk_writes"] == "sk-admin"
    assert (served["max_waiting"], served["request_timeout"], served["max_body_bytes"]) == (8, 2.5, 2**19)
    monkeypatch.setenv("FUSIONRAG_API_KEY", "sk-a, sk-b")
    monkeypatch.setenv("FUSIONRAG_CHUNKS_KEY", "off")
    result = CliRunner().invoke(cli, base)
    assert result.exit_code == 0, result.output
    assert served["api_keys"] == {"sk-a": None, "sk-b": None} and served["chunk_writes"] is False
    assert (served["max_waiting"], served["request_timeout"], served["max_body_bytes"]) == (256, 600.0, 16 * 2**20)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--api-key", "sk one"], "printable ASCII characters without spaces"),
        (["--api-key", "chunks="], "the chunks key must be"),
        (["--api-key", "chunks=a", "--api-key", "chunks=b"], "at most one chunks=KEY"),
        (["--api-key", "tenant:acme"], "tenant:NAME=KEY"),
        (["--api-key", "tenant:two\tlines=sk-x"], "tenant"),
        (["--limit", "waiting=0"], "waiting must be an integer in [1, 100000]"),
        (["--limit", "timeout=nan"], "timeout must be a number"),
        (["--limit", "speed=3"], "NAME one of waiting, timeout, body_mib"),
    ],
)
def test_bad_keys_and_limits_are_refused_while_parsing(flags, words):
    result = CliRunner().invoke(cli, ["serve", "--model", "tiny", *flags])
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output, result.output


def test_an_exposed_server_without_a_key_starts_with_a_warning(monkeypatch, tmp_path, caplog):
    import uvicorn

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append(kw["host"]))
    base = ["serve", "--model", "tiny", "--device", "cpu", "--store", str(tmp_path / "kv"), "--host", "0.0.0.0"]
    assert CliRunner().invoke(cli, base).exit_code == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "API key" in r.getMessage()]
    assert len(warnings) == 1 and "open to anyone who can reach this port" in warnings[0] and "--api-key" in warnings[0]
    caplog.clear()
    assert CliRunner().invoke(cli, [*base, "--api-key", "sk-one"]).exit_code == 0
    assert not [r for r in caplog.records if "API key" in r.getMessage()] and started == ["0.0.0.0", "0.0.0.0"]
