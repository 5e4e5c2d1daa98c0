"""Entries are bound to their key: swapped rows or files are misses, older codec versions too."""

import hashlib
import json
import logging
import struct

import pytest
import torch
from storage_testutil import FINGERPRINT, PREFIX, make_entry
from test_storage_safety_helpers import sql, stored_file

from fusionrag_llm.storage import (
    CorruptEntryError,
    KVEntry,
    RawCodec,
    StaleEntryError,
    StoreBudgets,
    StoreOptions,
    TieredStore,
    chunk_key,
)

TOKENS = [1000 + i for i in range(300)]
PLAIN, FUSED = (chunk_key(FINGERPRINT, PREFIX, TOKENS, variant) for variant in ("plain", "fused"))
OPTIONS = StoreOptions(disk_min_file_bytes=16 * 1024)
RAW = RawCodec()


def _variant(variant: str, num_tokens: int) -> KVEntry:
    """A chunk's plain or fused entry: the same token ids, different tensors (as in the engine)."""
    base = make_entry(7 if variant == "plain" else 8, num_tokens)
    return KVEntry(TOKENS[:num_tokens], base.keys, base.values, {"variant": variant, "model": FINGERPRINT})


def _keys(num_tokens):
    if num_tokens == len(TOKENS):
        return PLAIN, FUSED
    return tuple(chunk_key(FINGERPRINT, PREFIX, TOKENS[:num_tokens], v) for v in ("plain", "fused"))


def _write_both(folder, num_tokens):
    plain_key, fused_key = _keys(num_tokens)
    with TieredStore(folder, options=OPTIONS) as store:
        assert store.put(plain_key, _variant("plain", num_tokens))
        assert store.put(fused_key, _variant("fused", num_tokens))
    return plain_key, fused_key


def _swap_values(folder, a, b):
    (va,), (vb,) = (sql(folder, "SELECT value FROM entries WHERE key = ?", (k,))[0] for k in (a, b))
    sql(folder, "UPDATE entries SET value = ? WHERE key = ?", (vb, a))
    sql(folder, "UPDATE entries SET value = ? WHERE key = ?", (va, b))


def _swap_files(folder, a, b):
    pa, pb = stored_file(folder, a), stored_file(folder, b)
    da, db = pa.read_bytes(), pb.read_bytes()
    pa.write_bytes(db)
    pb.write_bytes(da)


@pytest.mark.parametrize("how", ["row values", "files on disk"])
def test_swapped_entries_are_misses_logged_and_counted(tmp_path, caplog, how):
    num_tokens = 4 if how == "row values" else 300  # small entries live in the row, large ones in files
    plain_key, fused_key = _write_both(tmp_path / "s", num_tokens)
    if how == "files on disk":
        _swap_files(tmp_path / "s", plain_key, fused_key)
    else:
        _swap_values(tmp_path / "s", plain_key, fused_key)
    with TieredStore(tmp_path / "s", StoreBudgets(host_bytes=0), options=OPTIONS) as store:
        with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage"):
            # Same token ids: only the key binding tells the fused entry from the plain one.
            assert store.get(plain_key, expect_token_ids=TOKENS[:num_tokens]) is None
            assert store.get(fused_key, expect_token_ids=TOKENS[:num_tokens]) is None
        assert plain_key in caplog.text and "holds the entry of key" in caplog.text
        stats = store.stats()
        assert stats.key_mismatches == 2 and stats.misses == 2 and stats.corrupt == 0
        report = store.verify()
        assert sorted(report.mismatched) == sorted([plain_key, fused_key]) and not report.repaired
        assert plain_key in store  # listed, not removed without repair
        assert store.verify(repair=True).repaired and store.keys() == [] and store.verify().ok
        assert store.put(plain_key, _variant("plain", num_tokens))  # recomputed and stored again
        assert store.get(plain_key)[0].bitwise_equal(_variant("plain", num_tokens))


def _as_version_1(data: bytes) -> bytes:
    """Re-frame codec bytes the way version 1 wrote them: no key in the header, version 1."""
    magic, _, header_len = struct.unpack_from("<4sHI", data, 0)
    start = struct.calcsize("<4sHI")
    header = json.loads(data[start : start + header_len])
    header.pop("key")
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    body = struct.pack("<4sHI", magic, 1, len(header_bytes)) + header_bytes + data[start + header_len : -32]
    return body + hashlib.blake2b(body, digest_size=32).digest()


@pytest.mark.parametrize("num_tokens", [4, 300])
def test_entry_of_the_older_codec_is_a_logged_miss_listed_as_stale(tmp_path, caplog, num_tokens):
    plain_key, fused_key = _write_both(tmp_path / "s", num_tokens)
    old = _as_version_1(RAW.encode(_variant("plain", num_tokens)))
    if num_tokens == 4:
        sql(tmp_path / "s", "UPDATE entries SET value = ? WHERE key = ?", (old, plain_key))
    else:
        stored_file(tmp_path / "s", plain_key).write_bytes(old)
    with TieredStore(tmp_path / "s", StoreBudgets(host_bytes=0), options=OPTIONS) as store:
        with caplog.at_level(logging.WARNING, logger="fusionrag_llm.storage"):
            assert store.get(plain_key) is None
        assert "stale" in caplog.text and "older codec (version 1)" in caplog.text
        assert store.stats().stale == 1 and store.stats().corrupt == 0
        assert store.get(fused_key) is not None
        report = store.verify()
        assert report.stale == [plain_key] and plain_key in store
        assert store.verify(repair=True).stale == [plain_key] and plain_key not in store


def test_codec_binds_keys_and_keeps_working_without_one():
    entry = _variant("fused", 4)
    assert RAW.decode_keyed(RAW.encode(entry))[1].bitwise_equal(entry)  # callers without a key
    assert RAW.decode_keyed(RAW.encode(entry))[0] is None
    key, decoded = RAW.decode_keyed(RAW.encode(entry.copy_to(dtype=torch.float16), key=PLAIN))
    assert key == PLAIN and decoded.meta == {"variant": "fused", "model": FINGERPRINT}
    with pytest.raises(ValueError, match="64 lowercase hex"):
        RAW.encode(entry, key="not-a-key")
    forged = RAW.encode(entry, key=PLAIN).replace(PLAIN.encode(), FUSED.encode())  # key edited in place
    with pytest.raises(CorruptEntryError, match="checksum"):
        RAW.decode_keyed(forged)
    with pytest.raises(StaleEntryError, match="older codec"):
        RAW.decode_keyed(_as_version_1(RAW.encode(entry)))


def test_meta_round_trips_through_disk_and_storage_dtype_is_exposed(tmp_path):
    with TieredStore(tmp_path / "s", storage_dtype=torch.float16, options=OPTIONS) as store:
        assert store.storage_dtype == torch.float16
        with pytest.raises(AttributeError):
            store.storage_dtype = torch.float32  # read-only
        store.put(PLAIN, _variant("plain", 300))
    with TieredStore(tmp_path / "s", options=OPTIONS) as store:
        assert store.storage_dtype is None
        entry, tier = store.get(PLAIN)
        assert tier == "disk" and entry.meta == {"variant": "plain", "model": FINGERPRINT}
        assert entry.dtype == torch.float16
