"""A stored entry is used only in the form the reading model needs: its layers, kv heads, head dim,
the store's dtype (or packing) and finite values, whichever tier served it.

Each test forges an entry through the store's own API under the key the engine reads (the entry's
bytes, key binding, variant, model and token ids are all valid: only its form is wrong), then asks
the same question as on a clean store: the answer is the same, the forged entry was a miss
(recomputed), and nothing raised from inside torch.
"""

import logging

import pytest

from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.storage import KVEntry, StoreBudgets, StoreOptions, TieredStore

CHUNKS = [
    "The lighthouse at Keldmouth was designed by the engineer Tamsin Orrery in 1872.",
    "Tamsin Orrery was born in Brightwater, a city at the mouth of the river Sel.",
]
EMBEDDINGS = [[1.0, 0.0], [0.0, 1.0]]
REQUEST = RAGRequest(chunks=CHUNKS, question="Where was the designer of the lighthouse born?")
OPTIONS = {"prefix_cache": False}


def _one_layer(k, v):
    return k[:1], v[:1]


def _one_head(k, v):
    return k[:, :1], v[:, :1]


def _half_head_dim(k, v):
    return k[..., : k.shape[-1] // 2], v[..., : v.shape[-1] // 2]


def _nan(k, v):
    k = k.clone()
    k[0, 0, 1, 2] = float("nan")
    return k, v


def _inf(k, v):
    v = v.clone()
    v[-1, -1, -1, -1] = float("inf")
    return k, v


def _other_dtype(k, v):
    return k.double(), v.double()


FORGERIES = {"one layer": _one_layer, "one kv head": _one_head, "half the head dim": _half_head_dim,
             "a NaN": _nan, "an infinity": _inf, "another dtype": _other_dtype}  # fmt: skip


def _engine(store=":memory:", **options):
    rag = FusionRAG.from_pretrained("tiny", store=store, options={**OPTIONS, **options})
    rag.add_chunks(CHUNKS, fuse=False, embeddings=EMBEDDINGS)
    return rag


def _forge(rag, forgery) -> str:
    """Replace the second chunk's plain entry with a forged one (valid but for its form); its key."""
    found = rag.stored(chunk_id_of(CHUNKS[1]), "plain")
    key, entry = found.key, found.entry
    keys, values = forgery(entry.keys.float(), entry.values.float())
    forged = KVEntry(entry.token_ids, keys.contiguous(), values.contiguous(), dict(entry.meta))
    assert rag.store.put(key, forged)
    return key


@pytest.fixture(scope="module")
def clean():
    return _engine().generate(REQUEST, method="full_reuse", max_new_tokens=6)


def _assert_recomputed(out, clean, caplog):
    assert out.token_ids == clean.token_ids and out.text == clean.text
    assert clean.stats.path_hits["miss"] == 0 and out.stats.path_hits["miss"] == 1
    assert "does not fit this model" in caplog.text and "treated as a miss" in caplog.text


@pytest.mark.parametrize("forgery", FORGERIES)
def test_an_entry_of_the_wrong_form_in_memory_is_a_miss(forgery, clean, caplog):
    rag = _engine()
    _forge(rag, FORGERIES[forgery])
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.fusion.entry_keys"):
        out = rag.generate(REQUEST, method="full_reuse", max_new_tokens=6)
    _assert_recomputed(out, clean, caplog)
    again = rag.generate(REQUEST, method="full_reuse", max_new_tokens=6)
    assert again.stats.path_hits["miss"] == 0 and again.token_ids == clean.token_ids  # the good entry replaced it


@pytest.mark.parametrize("forgery", ["one kv head", "a NaN"])
def test_an_entry_of_the_wrong_form_on_disk_is_a_miss(tmp_path, forgery, clean, caplog):
    store = TieredStore(tmp_path / "store", StoreBudgets(host_bytes=0))
    rag = _engine(store)
    key = _forge(rag, FORGERIES[forgery])
    assert store.tier_of(key) == "disk"
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.fusion.entry_keys"):
        out = rag.generate(REQUEST, method="full_reuse", max_new_tokens=6)
    _assert_recomputed(out, clean, caplog)
    store.close()


@pytest.mark.parametrize("forgery", ["one layer", "an infinity"])
def test_an_entry_of_the_wrong_form_on_the_shared_remote_is_a_miss(tmp_path, redis_server, forgery, clean, caplog):
    remote = StoreOptions(remote_url=redis_server.url, remote_secret="the secret of both stores")  # checked first
    writer = TieredStore(tmp_path / "a", StoreBudgets(host_bytes=0), options=remote)
    key = _forge(_engine(writer), FORGERIES[forgery])
    writer.close()
    reader = TieredStore(tmp_path / "b", StoreBudgets(host_bytes=0), options=remote)  # an empty local disk
    assert reader.tier_of(key) == "remote"
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.fusion.entry_keys"):
        out = FusionRAG.from_pretrained("tiny", store=reader, options=OPTIONS).generate(
            REQUEST, method="full_reuse", max_new_tokens=6)
    _assert_recomputed(out, clean, caplog)
    reader.close()


def test_an_entry_the_loader_fetched_ahead_is_checked_too(caplog):
    """Queued requests' entries are loaded on a background thread and handed to the engine: the same check."""
    requests = [RAGRequest(chunks=CHUNKS[:1], question="Who designed it?"), REQUEST]
    expected = _engine().generate_many(requests, method="full_reuse", max_new_tokens=4)
    rag = _engine()
    _forge(rag, FORGERIES["one kv head"])
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.fusion.entry_keys"):
        outs = rag.generate_many(requests, method="full_reuse", max_new_tokens=4)
    assert [o.token_ids for o in outs] == [e.token_ids for e in expected]
    assert outs[1].stats.prefetched_entries >= 1 and outs[1].stats.path_hits["miss"] == 1
    assert "does not fit this model" in caplog.text


@pytest.mark.parametrize("forgery", ["one kv head", "a NaN"])
def test_a_packed_entry_of_the_wrong_form_is_a_miss(forgery, caplog):
    expected = _engine(kv_codec="int8").generate(REQUEST, method="full_reuse", max_new_tokens=6)
    rag = _engine(kv_codec="int8")
    _forge(rag, FORGERIES[forgery])  # the store packs it: NaN scales, or a 1-head packed entry
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.fusion.entry_keys"):
        out = rag.generate(REQUEST, method="full_reuse", max_new_tokens=6)
    _assert_recomputed(out, expected, caplog)

