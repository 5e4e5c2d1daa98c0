"""The codec protocol: raw bytes unchanged, codecs by id, an int8-per-row codec (test-only) through a real store."""

import hashlib
import sys

import pytest
import torch
from storage_testutil import key_for, make_entry

from fusionrag_llm.storage import (
    CODECS,
    CodecRegistry,
    EntryCodec,
    KVEntry,
    QuantCodec,
    RawCodec,
    StaleEntryError,
    StoreBudgets,
    StoreOptions,
    TieredStore,
)
from fusionrag_llm.storage.codec import entry_from_header, expect_codec, tensor_bytes
from fusionrag_llm.storage.frame import CorruptEntryError, pack_frame, peek_codec_id, unpack_frame


class Int8RowCodec:
    """Entries whose keys/values are int8 with one float32 scale per row (`key_scales`, `value_scales`)."""

    codec_id = "int8-row-test"

    def encode(self, entry: KVEntry, *, key=None) -> bytes:
        if entry.dtype != torch.int8 or set(entry.extras) != {"key_scales", "value_scales"}:
            raise ValueError("int8-row-test stores int8 keys/values with key_scales and value_scales")
        header = {"shape": list(entry.keys.shape), "byteorder": sys.byteorder,
                  "token_ids": list(entry.token_ids), "meta": entry.meta}  # fmt: skip
        parts = [entry.keys, entry.values, entry.extras["key_scales"], entry.extras["value_scales"]]
        return pack_frame(self.codec_id, header, [tensor_bytes(p) for p in parts], key=key)

    def decode_keyed(self, data):
        frame = unpack_frame(data)
        expect_codec(frame, self.codec_id)
        shape = tuple(frame.header["shape"])
        numel, rows = shape[0] * shape[1] * shape[2] * shape[3], shape[0] * shape[1] * shape[2]
        if len(frame.payload) != 2 * numel + 2 * rows * 4:
            raise CorruptEntryError("payload length does not match the header")
        buffer = bytearray(frame.payload)
        keys = torch.frombuffer(buffer, dtype=torch.int8, count=numel).view(shape)
        values = torch.frombuffer(buffer, dtype=torch.int8, count=numel, offset=numel).view(shape)
        scales = torch.frombuffer(buffer, dtype=torch.float32, count=2 * rows, offset=2 * numel).view(2, *shape[:3], 1)
        extras = {"key_scales": scales[0], "value_scales": scales[1]}
        return frame.key, entry_from_header(frame.header, keys, values, extras)


def quantize(entry: KVEntry) -> KVEntry:
    """int8 per row (the last dim), the form the test codec stores."""

    def rows(t):
        scale = t.abs().amax(dim=-1, keepdim=True).clamp_min(1e-8) / 127
        return (t / scale).round().clamp(-127, 127).to(torch.int8), scale.float()

    keys, key_scales = rows(entry.keys)
    values, value_scales = rows(entry.values)
    return KVEntry(entry.token_ids, keys, values, entry.meta, {"key_scales": key_scales, "value_scales": value_scales})


def dequantize(entry: KVEntry) -> tuple[torch.Tensor, torch.Tensor]:
    return entry.keys.float() * entry.extras["key_scales"], entry.values.float() * entry.extras["value_scales"]


@pytest.fixture
def int8_codec():
    codec = CODECS.register(Int8RowCodec())
    yield codec
    CODECS.unregister(codec.codec_id)


def test_raw_bytes_are_those_of_format_version_2():
    keys = torch.arange(16, dtype=torch.float32).view(1, 2, 2, 4)
    entry = KVEntry((5, 6), keys, -keys, {"variant": "plain"})
    # Digests of the bytes written before codecs were pluggable: existing stores and older builds still read them.
    raw = RawCodec()
    assert CODECS.get("raw").encode(entry, key="ab" * 32) == raw.encode(entry, key="ab" * 32)
    assert hashlib.sha256(raw.encode(entry, key="ab" * 32)).hexdigest() == \
        "ef0c16caa39607d7b2c8f5f9933b903971827b0b0ab30a3cb566d185875e74fb"  # fmt: skip
    assert hashlib.sha256(raw.encode(entry.copy_to(dtype=torch.bfloat16))).hexdigest() == \
        "4bc0499594629979be1a0ff989fdf7fb107e7933d1945926f08f4957a9a34405"  # fmt: skip
    assert raw.encode(entry)[4:6] == (2).to_bytes(2, "little")


def test_registry_is_keyed_by_id_and_refuses_what_is_not_a_codec(int8_codec):
    assert isinstance(int8_codec, EntryCodec) and CODECS.get("int8-row-test") is int8_codec
    assert "raw" in CODECS.ids() and "int8-row-test" in CODECS.ids()
    with pytest.raises(ValueError, match="unknown codec 'nope'; registered: fp8, int4, int4.2, int8, int8-row-test, raw"):
        CODECS.get("nope")
    with pytest.raises(ValueError, match="taken"):
        CODECS.register(Int8RowCodec())
    with pytest.raises(ValueError, match="codec_id"):
        CodecRegistry(type("Bad", (Int8RowCodec,), {"codec_id": "Has Spaces"})())
    with pytest.raises(ValueError, match="decode_keyed"):
        CodecRegistry(object())
    with pytest.raises(ValueError, match="codec"):
        StoreOptions(codec="")


def test_int8_codec_round_trips_through_a_tiered_store_on_disk(tmp_path, int8_codec):
    original = make_entry(1, num_tokens=6)
    entry = quantize(original)
    options = StoreOptions(codec="int8-row-test")
    with TieredStore(tmp_path / "s", options=options) as store:
        assert store.codec_id == "int8-row-test" and store.put(key_for(1, 6), entry, persist=True)
    with TieredStore(tmp_path / "s", options=options) as reopened:
        got, tier = reopened.get(key_for(1, 6))
        assert tier == "disk" and got.bitwise_equal(entry) and got.nbytes == entry.nbytes
        keys, values = dequantize(got)
        assert torch.allclose(keys, original.keys, atol=0.05) and torch.allclose(values, original.values, atol=0.05)
        assert reopened.verify().ok
        with pytest.raises(ValueError, match="int8-row-test stores int8"):
            reopened.put(key_for(2), make_entry(2), persist=True)


def test_entries_of_another_codec_are_stale_misses_never_served(tmp_path, int8_codec, caplog):
    with TieredStore(tmp_path / "s", StoreBudgets(host_bytes=0), options=StoreOptions(codec="int8-row-test")) as s:
        s.put(key_for(3), quantize(make_entry(3)))
    with TieredStore(tmp_path / "s", StoreBudgets(host_bytes=0)) as raw_store:
        assert raw_store.codec_id == "raw"
        assert raw_store.get(key_for(3)) is None and raw_store.stats().stale == 1
        assert "written by codec 'int8-row-test'" in caplog.text
        # verify checks it with the codec that wrote it (a folder may hold several codecs' entries): valid
        report = raw_store.verify()
        assert report.ok and report.checked == 1 and key_for(3) in raw_store
    with pytest.raises(StaleEntryError, match="codec 'raw'"):
        int8_codec.decode_keyed(RawCodec().encode(make_entry(4)))
    CODECS.unregister(int8_codec.codec_id)  # a codec this reader does not know: its entries are stale
    with TieredStore(tmp_path / "s", StoreBudgets(host_bytes=0)) as raw_store:
        assert raw_store.verify().stale == [key_for(3)] and key_for(3) in raw_store  # listed, kept


def test_frame_checks_hold_for_every_codec():
    data = bytearray(Int8RowCodec().encode(quantize(make_entry(5)), key=key_for(5)))
    assert data[4:6] == (3).to_bytes(2, "little")  # version 3 names its codec: older builds see it as stale
    data[-40] ^= 0xFF
    with pytest.raises(CorruptEntryError, match="checksum"):
        Int8RowCodec().decode_keyed(bytes(data))
    with pytest.raises(ValueError, match="reserved"):
        pack_frame("x", {"key": "k"}, [], key=None)


def test_unknown_codec_id_opens_nothing(tmp_path):
    with pytest.raises(ValueError, match="unknown codec"):
        TieredStore(tmp_path / "s", options=StoreOptions(codec="missing"))
    assert not (tmp_path / "s").exists()


def test_entry_extras_travel_with_copies_and_count_in_nbytes():
    entry = quantize(make_entry(6))
    assert KVEntry(entry.token_ids, entry.keys, entry.values, entry.meta).extras == {}  # the old constructor
    copied = entry.copy_to()
    assert copied.bitwise_equal(entry) and copied.extras["key_scales"].data_ptr() != entry.extras["key_scales"].data_ptr()
    assert entry.nbytes == 2 * entry.keys.numel() + 2 * entry.extras["key_scales"].numel() * 4
    with pytest.raises(ValueError, match="casting it to torch.float16 is not allowed"):
        entry.copy_to(dtype=torch.float16)
    with pytest.raises(ValueError, match="raw codec stores keys and values only"):
        RawCodec().encode(entry)
    with pytest.raises(ValueError, match="extra name"):
        KVEntry((1,), torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), {}, {"Bad Name": torch.zeros(1)})
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        KVEntry((1,), torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), {}, {"scales": [1.0]})


def test_the_codec_a_frame_names_is_read_from_its_header_alone():
    data = RawCodec().encode(make_entry(5), key=key_for(5))
    assert peek_codec_id(data) == "raw" and peek_codec_id(QuantCodec("int8").encode(make_entry(5))) == "int8"
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF  # the checksum is not read: the decode that follows checks it
    assert peek_codec_id(bytes(damaged)) == "raw"
    assert peek_codec_id(b"FRKV") is None and peek_codec_id(b"not a frame at all, not one") is None
