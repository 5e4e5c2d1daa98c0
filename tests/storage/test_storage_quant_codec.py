"""Compressed entries: lossless round trips, quantization error bounds, checked frames, store tiers."""

from __future__ import annotations

import sys

import pytest
import torch

from fusionrag_llm.storage import (
    CODECS, CorruptEntryError, KVEntry, QuantCodec, RawCodec, StoreOptions, TieredStore, kv_tensors,
)
from fusionrag_llm.storage.frame import pack_frame
from fusionrag_llm.storage.quantize import SCHEMES

from storage_testutil import key_for, make_entry

KEY = "ab" * 32


def outlier_entry(tokens: int = 70, head_dim: int = 16) -> KVEntry:
    """Keys with per-channel offsets and an outlier channel (as real keys have), values per-token scaled."""
    gen = torch.Generator().manual_seed(3)
    shape = (3, 2, tokens, head_dim)
    keys = torch.randn(shape, generator=gen) + torch.linspace(-4, 4, head_dim)
    keys[..., 5] *= 20
    values = torch.randn(shape, generator=gen) * torch.rand(1, 1, tokens, 1, generator=gen) * 5
    return KVEntry(tuple(range(tokens)), keys, values, {"variant": "plain"})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lossless_codecs_round_trip_bit_exact(dtype):
    entry = make_entry(1, num_tokens=9, dtype=dtype)
    assert RawCodec().decode_keyed(RawCodec().encode(entry, key=KEY))[1].bitwise_equal(entry)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_packed_entry_round_trips_bit_exact_through_its_frame(scheme):
    codec = QuantCodec(scheme)
    packed = codec.compress(outlier_entry())
    assert codec.compress(packed) is packed  # already packed: kept as it is
    key, decoded = codec.decode_keyed(codec.encode(packed, key=KEY))
    assert key == KEY and decoded.bitwise_equal(packed)


def _bound(entry: KVEntry, packed: KVEntry, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element error bounds: half a quantization step (int8, int4), or fp8 e4m3's relative
    rounding (2^-4) plus its smallest subnormal step, in units of the stored scales."""
    extras = {name: t.float() for name, t in packed.extras.items()}
    tokens, head_dim = entry.keys.shape[2], entry.keys.shape[3]
    k_index = torch.arange(tokens) * extras["key_scales"].shape[2] // tokens
    v_index = torch.arange(head_dim) * extras["value_scales"].shape[3] // head_dim
    k_scale = extras["key_scales"].index_select(2, k_index)
    v_scale = extras["value_scales"].index_select(3, v_index)
    if scheme == "fp8":
        return entry.keys.abs() * 2**-4 + k_scale * 2**-9, entry.values.abs() * 2**-4 + v_scale * 2**-9
    return 0.5 * k_scale * 1.01 + 1e-6, 0.5 * v_scale * 1.01 + 1e-6


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_quantized_entries_stay_within_the_stated_tolerance(scheme):
    entry = outlier_entry()
    packed = QuantCodec(scheme).compress(entry)
    keys, values = kv_tensors(packed, "cpu", torch.float32)
    key_bound, value_bound = _bound(entry, packed, scheme)
    assert bool(((keys - entry.keys).abs() <= key_bound).all())
    assert bool(((values - entry.values).abs() <= value_bound).all())
    relative = float((keys - entry.keys).norm() / entry.keys.norm())
    assert relative < {"int8": 0.01, "fp8": 0.04, "int4": 0.1, "int4.2": 0.1}[scheme]


def test_packed_sizes_per_token_on_the_default_models_shape():
    entry = KVEntry(tuple(range(96)), torch.randn(30, 3, 96, 64), torch.randn(30, 3, 96, 64))
    per_token = {scheme: QuantCodec(scheme).compress(entry).nbytes / 96 for scheme in SCHEMES}
    assert entry.nbytes / 96 == 46080
    assert per_token["int8"] < 12_000 and per_token["fp8"] < 12_000
    assert per_token["int4.2"] < 8000 and per_token["int4"] < per_token["int4.2"]


def test_a_damaged_packed_frame_is_corrupt():
    codec = QuantCodec("int8")
    data = bytearray(codec.encode(codec.compress(outlier_entry()), key=KEY))
    data[len(data) // 2] ^= 0x01
    with pytest.raises(CorruptEntryError, match="checksum"):
        codec.decode_keyed(bytes(data))


def test_a_checksummed_frame_with_wrong_scales_is_corrupt():
    packed = QuantCodec("int8").compress(outlier_entry(tokens=4))
    scales = packed.extras["key_scales"][:, :, :, :-1].contiguous()  # one channel short
    tensors = [packed.keys, packed.values, scales, packed.extras["value_scales"]]
    names = ["keys", "values", "key_scales", "value_scales"]
    header = {"tensors": [[n, str(t.dtype).removeprefix("torch."), list(t.shape)] for n, t in zip(names, tensors)],
              "byteorder": sys.byteorder, "token_ids": list(packed.token_ids), "meta": {}}  # fmt: skip
    payload = [memoryview(t.contiguous().view(torch.uint8).numpy()).cast("B") for t in tensors]
    with pytest.raises(CorruptEntryError, match="int8"):
        QuantCodec("int8").decode_keyed(pack_frame("int8", header, payload, key=KEY))


def test_another_codecs_frame_is_never_misread():
    data = QuantCodec("int4").encode(outlier_entry(), key=KEY)
    with pytest.raises(CorruptEntryError):
        QuantCodec("int8").decode_keyed(data)
    with pytest.raises(CorruptEntryError):
        RawCodec().decode_keyed(data)


def test_unknown_scheme_and_codec_ids_name_the_allowed_ones():
    with pytest.raises(ValueError, match="int8, fp8, int4"):
        QuantCodec("int3")
    assert {"raw", "int8", "fp8", "int4"} <= set(CODECS.ids())


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_store_keeps_the_packed_form_in_memory_and_on_disk(tmp_path, scheme):
    entry = make_entry(4, num_tokens=40, head_dim=16)
    with TieredStore(tmp_path, options=StoreOptions(codec=scheme)) as store:
        assert store.put(key_for(4, 40), entry)
        from_memory, tier = store.get(key_for(4, 40))
        assert tier == "host" and from_memory.extras and from_memory.nbytes < entry.nbytes
        assert from_memory.bitwise_equal(store.stored_form(entry))
    with TieredStore(tmp_path, options=StoreOptions(codec=scheme)) as reopened:
        from_disk, tier = reopened.get(key_for(4, 40))
        assert tier == "disk" and from_disk.bitwise_equal(from_memory)


def test_memory_only_store_packs_with_its_codec():
    with TieredStore(None, options=StoreOptions(codec="int4")) as store:
        store.put(key_for(5), make_entry(5))
        assert store.get(key_for(5))[0].dtype == torch.uint8 and store.codec_id == "int4"
