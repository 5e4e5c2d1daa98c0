"""Engines on a real redis-server whose values carry a keyed MAC: what someone who can write the server
plants there is never served, whether chunk KV or exact path KV; an engine needs the secret (or the
explicit word that the network is trusted) to open the tier at all."""

import sys
from pathlib import Path

import pytest
import torch

from fusionrag_llm import FusionRAG, FusionRAGError, RAGRequest
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.storage import KVEntry, RawCodec, remote_key_prefix

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from concurrent_ingest_worker import text_of  # noqa: E402

CHUNKS = [text_of(n) for n in range(3)]
REQUEST = RAGRequest(chunks=CHUNKS, question="How many boats?")
BARE = "fusionrag:kv:"  # the default prefix: the keys of a trusted network
SECRET = "the secret these engines share"
PREFIX = remote_key_prefix(BARE, SECRET)  # the keys of engines with SECRET
METHODS = ("full_reuse", "full_attention")  # chunk entries; exact path blocks (prefix_cache is on)


def engine(folder: Path, ingest: bool = True, **options) -> FusionRAG:
    rag = FusionRAG.from_pretrained("tiny", store=folder, options=options)
    if ingest:
        rag.add_chunks(CHUNKS, fuse=False, embeddings=[[1.0, float(n)] for n in range(len(CHUNKS))])
    return rag


def distance(logits: torch.Tensor, reference: torch.Tensor) -> float:
    return (logits - reference).abs().max().item()


def forge_every_entry(clean: FusionRAG, server) -> list[str]:
    """Write, with a plain redis client, every entry `clean` holds under its real key (in the key space
    of SECRET and in that of a trusted network), with other numbers but a valid frame (checksum, key
    binding, variant, model, token ids, form) and no MAC."""
    keys = clean.store.keys()
    for key in keys:
        entry = clean.store.get(key)[0]
        fake = KVEntry(entry.token_ids, entry.keys * -2.0, entry.values + 1.0, dict(entry.meta))
        for prefix in (PREFIX, BARE):
            server.set(prefix + "e:" + key, RawCodec().encode(fake, key=key))
            server.hset(prefix + "size", key, 1)
    return keys


def answer(rag: FusionRAG):
    """The first read of everything the request needs: its answer, then its teacher-forced logits
    under both methods (in this order, so two engines compute alike)."""
    out = rag.generate(REQUEST, method="full_reuse", max_new_tokens=4)
    return out, {method: rag.logits(REQUEST, out.token_ids, method=method) for method in METHODS}


def test_values_forged_in_redis_are_misses_and_answers_equal_those_without_redis(tmp_path, redis_server):
    expected, logits = answer(engine(tmp_path / "clean"))  # no Redis: the reference
    writer = engine(tmp_path / "writer", remote=redis_server.url, remote_secret=SECRET)
    for method in METHODS:  # chunk entries and path blocks, on the server
        writer.generate(REQUEST, method=method, max_new_tokens=4)
    server = redis_server.client()
    forged = forge_every_entry(writer, server)
    assert len(forged) > len(CHUNKS) and set(forged) == {key.decode() for key in server.hkeys(PREFIX + "size")}

    trusting = engine(tmp_path / "trusting", remote=redis_server.url, remote_trusted=True)
    for method in METHODS:  # what a trusted network trusts: the forged values are served
        assert distance(trusting.logits(REQUEST, expected.token_ids, method=method), logits[method]) > 0.1, method

    reader = engine(tmp_path / "reader", ingest=False, remote=redis_server.url, remote_secret=SECRET)  # reads first
    out, read_logits = answer(reader)
    assert out.token_ids == expected.token_ids and out.text == expected.text
    assert expected.stats.path_hits["miss"] == 0 and out.stats.path_hits["miss"] == len(CHUNKS)
    for method in METHODS:
        assert distance(read_logits[method], logits[method]) <= 1e-4, method
    stats = reader.store.stats()
    assert stats.corrupt > len(CHUNKS) and stats.misses >= stats.corrupt  # chunk entries and path blocks

    other = FusionRAG.from_pretrained("tiny", store=tmp_path / "other", options={"remote": redis_server.url,
                                      "remote_secret": "another team's secret"})  # fmt: skip
    token_ids = writer.chunks[chunk_id_of(CHUNKS[0])].token_ids
    assert reader.stored(token_ids, "plain").tier != "remote"  # the reader's own copy, rewritten to the server
    assert other.stored(token_ids, "plain") is None and other.store.stats().corrupt == 0  # keys of its own


def test_a_remote_tier_needs_a_secret_or_a_trusted_network(tmp_path, redis_server, monkeypatch):
    monkeypatch.delenv("FUSIONRAG_REMOTE_SECRET", raising=False)
    monkeypatch.delenv("FUSIONRAG_REMOTE_TRUSTED", raising=False)
    with pytest.raises(FusionRAGError, match="needs a secret") as refused:
        FusionRAG.from_pretrained("tiny", store=tmp_path / "s", options={"remote": redis_server.url})
    assert "FUSIONRAG_REMOTE_SECRET" in str(refused.value) and "FUSIONRAG_REMOTE_TRUSTED=1" in str(refused.value)
    monkeypatch.setenv("FUSIONRAG_REMOTE_SECRET", SECRET)
    from_env = FusionRAG.from_pretrained("tiny", store=tmp_path / "s", options={"remote": redis_server.url})
    assert from_env.store.options.remote_secret == SECRET
    trusted = FusionRAG.from_pretrained("tiny", store=tmp_path / "s", options={"remote": redis_server.url,
                                        "remote_trusted": True})  # fmt: skip
    assert trusted.store.options.remote_secret is None  # an option given: the environment is not read
    assert SECRET not in repr(trusted.store.options) and "remote" in trusted.store.tier_names
    monkeypatch.setenv("FUSIONRAG_REMOTE_TRUSTED", "perhaps")
    with pytest.raises(FusionRAGError, match="FUSIONRAG_REMOTE_TRUSTED must be"):
        FusionRAG.from_pretrained("tiny", store=tmp_path / "s", options={"remote": redis_server.url})
