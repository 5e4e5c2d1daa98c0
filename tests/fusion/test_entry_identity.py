"""An entry is served only as what it claims to be: its variant, its model, its storage exactness."""

import logging

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.storage import KVEntry

CHUNKS = [
    "The lighthouse at Keldmouth was designed by the engineer Tamsin Orrery in 1872.",
    "Tamsin Orrery was born in Brightwater, a city at the mouth of the river Sel.",
    "Brightwater is the capital of Lowmarch, a flat province crossed by canals.",
]
EMBEDDINGS = [[1, 0.2, 0], [0.9, 0.4, 0], [0.7, 0.7, 0]]
REQUEST = RAGRequest(chunks=[CHUNKS[0], CHUNKS[2], CHUNKS[1]], question="Where was the lighthouse designer born?")


def reference_logits(request=REQUEST, new_tokens=6):
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    out = rag.generate(request, method="full_attention", max_new_tokens=new_tokens)
    return out.token_ids, rag.logits(request, out.token_ids, method="full_attention")


def test_fused_entry_filed_as_plain_is_not_served(caplog):
    """The first chunk after S0 is served from its plain entry as exact KV: a fused entry under the
    plain key would silently change even r = 1 (nothing recomputes an exact block)."""
    tokens, expected = reference_logits()
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    fused, plain = rag.stored(chunk_id_of(CHUNKS[0]), "fused"), rag.stored(chunk_id_of(CHUNKS[0]), "plain")
    rag.store.put(plain.key, fused.entry)  # filed under the wrong variant
    with caplog.at_level(logging.WARNING):
        logits = rag.logits(REQUEST, tokens, method="fusionrag", recompute_ratio=1.0)
    assert "claims variant 'fused'" in caplog.text
    assert (logits - expected).abs().max().item() <= 1e-4


def test_entry_of_another_model_is_a_miss(caplog):
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(CHUNKS, fuse=False, embeddings=EMBEDDINGS)
    chunk_id = chunk_id_of(CHUNKS[1])
    stored = rag.stored(chunk_id, "plain")
    entry = stored.entry
    forged = KVEntry(entry.token_ids, entry.keys, entry.values, {"variant": "plain", "model": "0" * 64})
    rag.store.put(stored.key, forged)
    with caplog.at_level(logging.WARNING):
        assert rag.stored(chunk_id, "plain") is None
    out = rag.generate(REQUEST, method="full_reuse", max_new_tokens=2)
    assert out.stats.path_hits["miss"] == 1  # recomputed, then stored again under the right identity
    assert rag.stored(chunk_id, "plain") is not None


def test_lossy_store_never_serves_approximate_kv_as_exact(tmp_path):
    """float16 entries under float32 compute are approximate: r = 1 and Full Attention stay exact,
    however often the same prompt is asked (path blocks are kept in float32; no float16 entry is
    ever served as exact, not even the first chunk's after S0)."""
    tokens, expected = reference_logits()
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "fp16"})
    assert not rag.engine.keys.lossless
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    for _ in range(2):  # the second round finds whatever the first one stored
        for method in ("full_attention", "fusionrag", "cacheblend"):
            logits = rag.logits(REQUEST, tokens, method=method, recompute_ratio=1.0)
            assert (logits - expected).abs().max().item() <= 1e-4, method
    out = rag.generate(REQUEST, method="fusionrag", recompute_ratio=0.5, max_new_tokens=2)
    assert out.stats.path_hits["exact"] == 3  # the exact blocks Full Attention stored (float32)
    other = RAGRequest(chunks=REQUEST.chunks[::-1], question=REQUEST.question)
    out = rag.generate(other, method="fusionrag", recompute_ratio=0.5, max_new_tokens=2)
    assert out.stats.path_hits == {"exact": 0, "chunk": 3, "miss": 0}  # even the chunk right after S0 is reused
    assert out.stats.reused_tokens > 0


def test_lossy_and_exact_stores_in_one_folder_keep_apart(tmp_path):
    exact = FusionRAG.from_pretrained("tiny", store=tmp_path)
    exact.add_chunks(CHUNKS, fuse=False, embeddings=EMBEDDINGS)
    chunk_id = chunk_id_of(CHUNKS[0])
    exact_key = exact.stored(chunk_id, "plain").key
    exact.store.close()
    lossy = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": "fp16"})
    assert lossy.stored(chunk_id, "plain") is None  # the chunk is registered, its float32 entry not served
    lossy.add_chunks(CHUNKS, fuse=False, embeddings=EMBEDDINGS)
    found = lossy.stored(chunk_id, "plain")
    assert found.key != exact_key and found.entry.dtype == torch.float16


@pytest.mark.parametrize("store_dtype", ["model", "float32"])
def test_store_in_the_compute_dtype_is_lossless(tmp_path, store_dtype):
    rag = FusionRAG.from_pretrained("tiny", store=tmp_path, options={"kv_codec": store_dtype})
    assert rag.engine.keys.lossless
    rag.add_chunks(CHUNKS, fuse=False, embeddings=EMBEDDINGS)
    rag.generate(REQUEST, method="full_attention", max_new_tokens=2)
    again = rag.generate(REQUEST, method="full_reuse", max_new_tokens=2)
    assert again.stats.path_hits["exact"] == 3  # the path blocks of the first run are reused
