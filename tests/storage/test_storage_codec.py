"""The raw codec: bit-identical round trips in the entry's dtype, and detection of every kind of damage."""

import pytest
import torch
from storage_testutil import make_entry

from fusionrag_llm.storage import CorruptEntryError, RawCodec

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
RAW = RawCodec()


def encode(entry):
    return RAW.encode(entry)


def decode(data):
    return RAW.decode_keyed(data)[1]


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_bit_identical(dtype):
    entry = make_entry(3, num_tokens=5, dtype=dtype)
    decoded = decode(encode(entry))
    assert decoded.dtype == dtype
    assert decoded.token_ids == entry.token_ids
    assert decoded.meta == entry.meta
    assert decoded.bitwise_equal(entry)


def test_special_values_survive():
    entry = make_entry(4, dtype=torch.bfloat16)
    entry.keys.view(-1)[:4] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0])
    decoded = decode(encode(entry))
    assert decoded.bitwise_equal(entry)


def test_an_entry_is_stored_in_its_own_dtype():
    entry = make_entry(5, dtype=torch.float32)
    half = entry.copy_to(dtype=torch.float16)  # as a store with storage_dtype=float16 hands it over
    data = encode(half)
    assert len(data) < len(encode(entry))
    stored = decode(data)
    assert stored.dtype == torch.float16 and stored.bitwise_equal(half)
    assert torch.equal(stored.keys, entry.keys.half())


def test_unsupported_dtype_is_rejected():
    with pytest.raises(ValueError, match="not supported"):
        encode(make_entry(0, dtype=torch.complex64))


def test_decoded_tensors_are_writable_and_independent():
    data = encode(make_entry(6))
    first, second = decode(data), decode(data)
    first.keys.zero_()
    assert not torch.equal(first.keys, second.keys)
    assert decode(data).bitwise_equal(second)


@pytest.mark.parametrize("position", [0, 5, 12, 100, -40, -1])
def test_any_flipped_byte_is_detected(position):
    data = bytearray(encode(make_entry(7)))
    data[position] ^= 0x10
    with pytest.raises(CorruptEntryError):
        decode(bytes(data))


@pytest.mark.parametrize("length", [0, 3, 9, 50, -33, -1])
def test_truncation_is_detected(length):
    data = encode(make_entry(8))
    with pytest.raises(CorruptEntryError, match="truncated|checksum|length"):
        decode(data[:length])


def test_bad_magic_message():
    data = bytearray(encode(make_entry(9)))
    data[:4] = b"XXXX"
    with pytest.raises(CorruptEntryError, match="magic"):
        decode(bytes(data))


def test_appended_bytes_are_detected():
    with pytest.raises(CorruptEntryError):
        decode(encode(make_entry(10)) + b"\x00")
