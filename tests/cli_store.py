"""A store folder ingested through the CLI (tiny model, one neighbour) from a list of texts, for tests of
CLI queries."""

from click.testing import CliRunner

from fusionrag_llm.cli.main import cli


def cli_ingested_store(tmp_path, texts) -> str:
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, text in enumerate(texts):
        (docs / f"{i}.md").write_text(text)
    store = str(tmp_path / "store")
    result = CliRunner().invoke(cli, ["ingest", str(docs), "--model", "tiny", "--store", store, "--neighbors", "1"])
    assert result.exit_code == 0, result.output
    return store
