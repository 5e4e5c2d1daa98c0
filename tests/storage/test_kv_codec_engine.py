"""The engine on compressed stores (kv_codec): one key gives one KV whatever served it, corruption of
a packed entry on a real disk store is caught and recomputed, r = 1 still equals Full Attention."""

import logging
import sqlite3
import sys
from pathlib import Path

import pytest
import torch

from fusionrag_llm import FusionRAG, FusionRAGError, RAGRequest
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.storage import kv_tensors

sys.path.insert(0, str(Path(__file__).parent))
from store_worker import chunks  # noqa: E402

VECTORS = [[1, 0], [0, 1], [1, 1]]


def corrupt_stored(folder: Path, key: str) -> None:
    """Flip one byte in the middle of the bytes the store keeps for ``key`` (a row of its index, or a file)."""
    with sqlite3.connect(folder / "cache.db") as db:
        (value,) = db.execute("SELECT value FROM entries WHERE key = ?", (key,)).fetchone()
        if value is not None:
            data = bytearray(value)
            data[len(data) // 2] ^= 0xFF
            db.execute("UPDATE entries SET value = ? WHERE key = ?", (bytes(data), key))
            return
    (path,) = folder.rglob(f"{key}.val")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def plain_key(rag: FusionRAG, text: str) -> str:
    return rag.stored(chunk_id_of(text), "plain").key


@pytest.mark.parametrize("codec", ["int8", "fp8", "int4", "bf16"])
def test_fresh_memory_and_disk_reads_of_a_key_give_one_kv(tmp_path, codec):
    texts = chunks(0, 3)
    request = RAGRequest(chunks=texts, question="How many boats?")
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False, "kv_codec": codec})
    rag.add_chunks(texts[:2], fuse=False, embeddings=VECTORS[:2])  # the third is computed by the request
    fresh = rag.generate(request, method="full_reuse", max_new_tokens=6)
    blocks = 1 if codec == "bf16" else 0  # a bf16 store keeps S0's exact block too (computed at ingestion)
    assert fresh.stats.path_hits["miss"] == 1 and fresh.stats.tier_hits["host"] == 2 + blocks
    from_memory = rag.generate(request, method="full_reuse", max_new_tokens=6)
    rag.store.close()
    reopened = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False, "kv_codec": codec})
    from_disk = reopened.generate(request, method="full_reuse", max_new_tokens=6)
    assert from_memory.stats.path_hits["miss"] == 0 and from_disk.stats.tier_hits["disk"] == 3 + blocks
    assert fresh.token_ids == from_memory.token_ids == from_disk.token_ids


def test_each_codec_has_its_own_keys_and_the_entries_are_smaller(tmp_path):
    sizes = {}
    for codec in ("float32", "bf16", "int8", "int4"):
        rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False, "kv_codec": codec})
        rag.add_chunks(chunks(0, 1), fuse=False, embeddings=VECTORS[:1])
        sizes[codec] = rag.stored(chunk_id_of(chunks(0, 1)[0]), "plain").entry.nbytes
        assert rag.engine.keys.lossless == (codec == "float32")
        rag.store.close()
    assert sizes["float32"] == 2 * sizes["bf16"] and sizes["bf16"] > sizes["int8"] > sizes["int4"]


def test_corrupt_packed_entry_is_detected_dropped_and_recomputed(tmp_path, caplog):
    texts = chunks(0, 3)
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False, "kv_codec": "int8"})
    rag.add_chunks(texts, fuse=False, embeddings=VECTORS)
    request = RAGRequest(chunks=texts, question="How many boats?")
    clean = rag.generate(request, method="full_reuse", max_new_tokens=6)
    victim = plain_key(rag, texts[1])
    rag.store.close()
    corrupt_stored(tmp_path, victim)
    reopened = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False, "kv_codec": "int8"})
    with caplog.at_level(logging.WARNING):
        out = reopened.generate(request, method="full_reuse", max_new_tokens=6)
    assert "corrupt" in caplog.text
    assert out.stats.path_hits == {"exact": 0, "chunk": 2, "miss": 1}
    assert out.token_ids == clean.token_ids  # recomputed and packed again: the same numbers
    again = reopened.generate(request, method="full_reuse", max_new_tokens=6)
    assert again.stats.path_hits == {"exact": 0, "chunk": 3, "miss": 0}
    assert reopened.store.verify().corrupt == []


def test_recomputing_everything_equals_full_attention_in_a_quantized_store(tmp_path):
    texts = chunks(0, 3)
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"prefix_cache": False, "kv_codec": "int4"})
    rag.add_chunks(texts, embeddings=VECTORS, neighbors=2)
    request = RAGRequest(chunks=texts, question="How many ferries?")
    full = rag.generate(request, method="full_attention", max_new_tokens=6)
    assert rag.generate(request, method="fusionrag", recompute_ratio=1.0, max_new_tokens=6).token_ids == full.token_ids


def test_packed_entries_expand_on_the_models_device_and_dtype(tmp_path):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "fp8"})
    rag.add_chunks(chunks(0, 1), fuse=False, embeddings=VECTORS[:1])
    entry = rag.stored(chunk_id_of(chunks(0, 1)[0]), "plain").entry
    model = rag.engine.model
    keys, values = kv_tensors(entry, model.device, model.dtype)
    assert entry.dtype == torch.float8_e4m3fn and keys.dtype == model.dtype and keys.shape[-1] == values.shape[-1]


def test_bad_kv_codec_names_the_allowed_ones(tmp_path):
    with pytest.raises(FusionRAGError, match="allowed: model, float32, bf16, fp16, int8, fp8, int4"):
        FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "int3"})
