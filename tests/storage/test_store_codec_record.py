"""A store folder records its kv_codec: every later opener keeps entries the same way, new stores are
bf16 by default, and a bf16 store still keeps exact path blocks in the compute dtype."""

import json
import logging
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from fusionrag_llm import DEFAULT_KV_CODEC, FusionRAG, FusionRAGError, RAGRequest
from fusionrag_llm.cli.main import cli
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.storage import StoreConfigError
from fusionrag_llm.storage.store_codec import CODEC_FILE, _record, recorded_kv_codec, store_kv_codec

sys.path.insert(0, str(Path(__file__).parent))
from store_worker import chunks  # noqa: E402

VECTORS = [[1, 0], [0, 1], [1, 1]]


def test_a_new_store_records_the_default_and_reopens_with_it(tmp_path):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False})
    assert DEFAULT_KV_CODEC == "bf16" and recorded_kv_codec(tmp_path) == "bf16"
    assert rag.store.storage_dtype == torch.bfloat16 and not rag.engine.keys.lossless
    rag.add_chunks(chunks(0, 2), fuse=False, embeddings=VECTORS[:2])
    rag.store.close()
    again = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False})
    out = again.generate(RAGRequest(chunks=chunks(0, 2), question="How many boats?"), method="full_reuse", max_new_tokens=2)
    assert out.stats.path_hits == {"exact": 0, "chunk": 2, "miss": 0}  # only the prompt prefix is computed


def test_a_store_ingested_with_a_codec_is_read_with_it_by_an_engine_given_none(tmp_path):
    """The CLI ingests with kv_codec=int8; the Python API, told nothing, finds every entry."""
    texts = chunks(0, 3)
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, text in enumerate(texts):
        (docs / f"{i}.md").write_text(text)
    store = tmp_path / "store"
    args = ["ingest", str(docs), "--model", "tiny", "--store", str(store), "--neighbors", "1", "--engine-option", "kv_codec=int8"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert recorded_kv_codec(store) == "int8"
    rag = FusionRAG.from_pretrained("tiny", store=store)
    assert rag.store.codec_id == "int8" and len(rag.chunks) == 3
    out = rag.generate(RAGRequest(chunks=texts, question="How many boats?"), method="fusionrag", max_new_tokens=2)
    assert out.stats.path_hits["miss"] == 0 and out.stats.variant_hits == {"fused": 2, "plain": 1}  # plain: the first


def test_a_store_made_before_records_keeps_the_compute_dtype(tmp_path):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False, "kv_codec": "model"})
    rag.add_chunks(chunks(0, 1), fuse=False, embeddings=VECTORS[:1])
    rag.store.close()
    (tmp_path / CODEC_FILE).unlink()  # as a store written before stores recorded their codec
    old = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False})
    assert recorded_kv_codec(tmp_path) == "model" and old.engine.keys.lossless
    assert old.stored(chunk_id_of(chunks(0, 1)[0]), "plain") is not None


def test_a_codec_given_wins_and_the_record_stays(tmp_path, caplog):
    assert store_kv_codec(tmp_path, None) == "bf16"
    with caplog.at_level(logging.INFO, logger="fusionrag_llm.storage.store_codec"):
        assert store_kv_codec(tmp_path, "int4") == "int4"
    assert "records kv_codec 'bf16'" in caplog.text and recorded_kv_codec(tmp_path) == "bf16"
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "int4"})
    assert rag.store.codec_id == "int4.2" and recorded_kv_codec(tmp_path) == "bf16"


def test_the_first_record_stands(tmp_path):
    _record(tmp_path, "fp8")
    _record(tmp_path, "int4")  # a second opener racing the first: its record is not written
    assert recorded_kv_codec(tmp_path) == "fp8"
    assert [p.name for p in tmp_path.iterdir()] == [CODEC_FILE]  # no temporary file left behind


@pytest.mark.parametrize("content", ["{not json", '{"kv_codec": "int3"}', '["bf16"]', '{"kv_codec": "../x"}'])
def test_a_damaged_record_is_a_clear_error(tmp_path, content):
    (tmp_path / CODEC_FILE).write_text(content)
    with pytest.raises(FusionRAGError, match=r"kv_codec\.json.*delete that file"):
        FusionRAG.from_pretrained("tiny", store=tmp_path)


def test_a_record_that_is_a_link_is_not_followed(tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text('{"kv_codec": "int8"}')
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / CODEC_FILE).symlink_to(outside)
    with pytest.raises(StoreConfigError, match=r"kv_codec\.json.* cannot be read"):
        recorded_kv_codec(tmp_path / "store")


def test_a_bf16_store_keeps_exact_path_blocks_in_the_compute_dtype(tmp_path):
    """bf16 chunk entries, float32 path blocks: the alternative path still serves exact prefixes,
    and r = 1 equals Full Attention."""
    texts = chunks(0, 3)
    request = RAGRequest(chunks=texts, question="How many ferries?")
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path)
    assert rag.engine.keys.exact_blocks and not rag.engine.keys.lossless
    rag.add_chunks(texts, embeddings=VECTORS, neighbors=2)
    full = rag.generate(request, method="full_attention", max_new_tokens=6)  # exact: stores its path blocks
    again = rag.generate(request, method="fusionrag", recompute_ratio=0.15, max_new_tokens=6)
    assert again.stats.path_hits["exact"] == 3 and again.token_ids == full.token_ids
    block_key = rag.engine.keys.path_key(rag.engine.keys.s0_ids)
    assert rag.store.get(block_key)[0].dtype == torch.float32
    assert rag.stored(chunk_id_of(texts[0]), "plain").entry.dtype == torch.bfloat16
    other = RAGRequest(chunks=texts[::-1], question="How many ferries?")
    fresh = FusionRAG.from_pretrained("tiny", store=":memory:", options={"kv_codec": "model"})
    expected = fresh.generate(other, method="full_attention", max_new_tokens=6)
    assert rag.generate(other, method="fusionrag", recompute_ratio=1.0, max_new_tokens=6).token_ids == expected.token_ids


def test_an_int8_store_keeps_no_exact_blocks(tmp_path):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "int8"})
    assert not rag.engine.keys.exact_blocks
    with pytest.raises(ValueError, match="packed entries only"):
        rag.store.put("ab" * 32, rag.engine.computer.compute_exact((1, 2, 3)), exact=True)


def test_a_memory_store_keeps_the_compute_dtype_unless_told():
    assert FusionRAG.from_pretrained("tiny", store=":memory:").engine.keys.lossless
    assert FusionRAG.from_pretrained("tiny", store=":memory:", options={"kv_codec": "bf16"}).store.storage_dtype == torch.bfloat16


def test_the_record_is_plain_json(tmp_path):
    FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "fp16"})
    assert json.loads((tmp_path / CODEC_FILE).read_text()) == {"kv_codec": "fp16"}


def test_cache_verify_checks_entries_of_every_codec_with_their_own(tmp_path):
    """A folder holding int8 and bf16 entries is clean to `fusionrag cache verify`, which opens it
    without a codec; a damaged int8 entry is still found corrupt (not taken for a stale one)."""
    from test_kv_codec_engine import corrupt_stored

    for codec in ("int8", "bf16"):
        rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": codec})
        rag.add_chunks(chunks(0, 2), fuse=False, embeddings=VECTORS[:2])
        rag.store.close()
    runner = CliRunner()
    clean = runner.invoke(cli, ["cache", "verify", "--store", str(tmp_path)])
    assert clean.exit_code == 0 and "0 corrupt, 0 stale" in clean.output, clean.output
    stats = runner.invoke(cli, ["cache", "stats", "--store", str(tmp_path)])
    assert "kv_codec: int8" in stats.output
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "int8"})
    victim = rag.stored(chunk_id_of(chunks(0, 2)[1]), "plain").key
    rag.store.close()
    corrupt_stored(tmp_path, victim)
    damaged = runner.invoke(cli, ["cache", "verify", "--store", str(tmp_path)])
    assert damaged.exit_code == 1 and f"removed corrupt entry {victim}" in damaged.output, damaged.output
    assert "0 stale" in damaged.output
