"""``--remote`` / ``$FUSIONRAG_REMOTE``: two ingests on separate folders share one redis-server, its
values authenticated with ``$FUSIONRAG_REMOTE_SECRET`` (or, declared trusted, without a MAC)."""

from click.testing import CliRunner

from fusionrag_llm.cli.main import cli
from fusionrag_llm.storage import remote_key_prefix

SECRET = {"FUSIONRAG_REMOTE_SECRET": "the secret of these commands", "FUSIONRAG_REMOTE_TRUSTED": None}
NO_SECRET = {"FUSIONRAG_REMOTE_SECRET": None, "FUSIONRAG_REMOTE_TRUSTED": None}


def run(*args, env=None):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, env={**SECRET, **(env or {})})


def test_a_second_ingest_on_another_folder_loads_what_the_first_computed(tmp_path, redis_server):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("The Zorblat river flows through the city of Quennel.")
    (docs / "b.txt").write_text("Quennel is the capital of Marovia, a small kingdom in the hills.")
    first = run("ingest", str(docs), "--model", "tiny", "--store", str(tmp_path / "one"), "--neighbors", "1",
                "--remote", redis_server.url)  # fmt: skip
    assert "2 plain and 2 fused entries computed" in first.output, first.output
    second = run("ingest", str(docs), "--model", "tiny", "--store", str(tmp_path / "two"), "--neighbors", "1",
                 env={"FUSIONRAG_REMOTE": redis_server.url})  # fmt: skip
    assert "0 plain and 0 fused entries computed" in second.output, second.output
    other = run("ingest", str(docs), "--model", "tiny", "--store", str(tmp_path / "three"), "--neighbors", "1",
                "--remote", redis_server.url, env={"FUSIONRAG_REMOTE_SECRET": "another secret, another team"})  # fmt: skip
    assert "2 plain and 2 fused entries computed" in other.output, other.output  # nothing served across secrets


def test_a_remote_tier_without_a_secret_is_a_clean_error_unless_declared_trusted(tmp_path, redis_server):
    (tmp_path / "a.txt").write_text("The Zorblat river flows through the city of Quennel.")
    args = ["ingest", str(tmp_path / "a.txt"), "--model", "tiny", "--no-fuse", "--remote", redis_server.url]
    refused = CliRunner().invoke(cli, [*args, "--store", str(tmp_path / "s")], env=NO_SECRET)
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert "needs a secret" in refused.output and "FUSIONRAG_REMOTE_SECRET" in refused.output, refused.output
    trusted = run(*args, "--store", str(tmp_path / "t"), env={**NO_SECRET, "FUSIONRAG_REMOTE_TRUSTED": "1"})
    assert trusted.exit_code == 0 and "1 plain and 0 fused entries computed" in trusted.output, trusted.output
    stats = CliRunner().invoke(cli, ["cache", "stats", "--store", str(tmp_path / "t"), "--remote", redis_server.url],
                               env=NO_SECRET)  # fmt: skip
    assert stats.exit_code != 0 and "--remote" in stats.output and "needs a secret" in stats.output


def test_a_url_of_another_scheme_is_a_clean_error(tmp_path):
    (tmp_path / "a.txt").write_text("text")
    result = run("ingest", str(tmp_path / "a.txt"), "--model", "tiny", "--store", str(tmp_path / "s"),
                 "--remote", "http://127.0.0.1:6379")  # fmt: skip
    assert result.exit_code != 0 and "redis://, rediss:// or unix://" in result.output


def test_cache_stats_and_verify_read_the_remote_tier_when_given(tmp_path, redis_server):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("The Zorblat river flows through the city of Quennel.")
    store = str(tmp_path / "one")
    assert run("ingest", str(docs), "--model", "tiny", "--store", store, "--no-fuse", "--remote", redis_server.url).exit_code == 0
    stats = run("cache", "stats", "--store", store, "--remote", redis_server.url)
    entries = redis_server.client().hlen(remote_key_prefix("fusionrag:kv:", SECRET["FUSIONRAG_REMOTE_SECRET"]) + "size")
    assert entries >= 1 and f"entries in the remote tier: {entries} " in stats.output, stats.output
    assert "remote tier" not in run("cache", "stats", "--store", store, env={"FUSIONRAG_REMOTE": redis_server.url}).output
    checked = run("cache", "verify", "--store", store, "--remote", redis_server.url)
    disk_only = run("cache", "verify", "--store", store)
    assert checked.exit_code == 0 and disk_only.exit_code == 0
    count = int(disk_only.output.split()[1])
    assert f"checked {count + entries} entries" in checked.output, (checked.output, disk_only.output)
    bad = CliRunner().invoke(cli, ["cache", "stats", "--store", store, "--remote", "http://x"])
    assert bad.exit_code != 0 and "--remote" in bad.output
