"""KVEntry validation and content-addressed keys."""

import pytest
import torch
from storage_testutil import FINGERPRINT, make_entry

from fusionrag_llm.models.fingerprint import model_digest
from fusionrag_llm.storage import KVEntry, chunk_key, path_key
from fusionrag_llm.storage.keys import check_key, path_block_key, path_keys


def test_entry_validates_shapes_against_token_ids():
    kv = torch.zeros(2, 1, 3, 4)
    assert KVEntry((1, 2, 3), kv, kv.clone()).nbytes == 2 * 2 * 1 * 3 * 4 * 4
    with pytest.raises(ValueError, match="T=3"):
        KVEntry((1, 2), kv, kv.clone())
    with pytest.raises(ValueError, match="same shape"):
        KVEntry((1, 2, 3), kv, torch.zeros(2, 1, 3, 5))
    with pytest.raises(ValueError, match="4-D"):
        KVEntry((1, 2, 3), torch.zeros(3, 4), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="dtype"):
        KVEntry((1, 2, 3), kv, kv.half())
    with pytest.raises(ValueError, match="JSON"):
        KVEntry((1, 2, 3), kv, kv.clone(), {"bad": object()})
    with pytest.raises(ValueError, match="ints"):
        KVEntry((1, 2.5, 3), kv, kv.clone())


def test_entry_copy_never_aliases():
    entry = make_entry(0)
    copy = entry.copy_to()
    assert copy.bitwise_equal(entry)
    copy.keys.add_(1.0)
    copy.meta["seed"] = -1
    assert not copy.bitwise_equal(entry)
    assert entry.meta["seed"] == 0


def test_bitwise_equal_sees_one_flipped_bit():
    entry = make_entry(1, dtype=torch.bfloat16)
    other = entry.copy_to()
    other.values.view(torch.int16).view(-1)[5] ^= 1
    assert not entry.bitwise_equal(other)


def test_chunk_keys_differ_in_every_component():
    tokens = [10, 11, 12]
    base = chunk_key(FINGERPRINT, [1, 2], tokens, "plain")
    variants = {
        "fingerprint": chunk_key(model_digest("other", "float32"), [1, 2], tokens, "plain"),
        "dtype": chunk_key(model_digest("tiny-test", "bfloat16"), [1, 2], tokens, "plain"),
        "prefix": chunk_key(FINGERPRINT, [1, 3], tokens, "plain"),
        "no prefix": chunk_key(FINGERPRINT, [], tokens, "plain"),
        "tokens": chunk_key(FINGERPRINT, [1, 2], [10, 11, 13], "plain"),
        "variant": chunk_key(FINGERPRINT, [1, 2], tokens, "fused"),
        "fusion": chunk_key(FINGERPRINT, [1, 2], tokens, "fused", {"neighbors": ["a"], "n": 1}),
        "fusion order": chunk_key(FINGERPRINT, [1, 2], tokens, "fused", {"neighbors": ["b"], "n": 1}),
        # the boundary between prefix and chunk moves: same token string, different key
        "boundary": chunk_key(FINGERPRINT, [1], [2, 10, 11, 12], "plain"),
    }
    keys = [base, *variants.values()]
    assert len(set(keys)) == len(keys)
    assert all(check_key(key) == key for key in keys)


def test_keys_are_deterministic_and_canonical():
    fusion_a = {"n": 2, "neighbors": ["x", "y"]}
    fusion_b = {"neighbors": ["x", "y"], "n": 2}  # same mapping, other insertion order
    key_a = chunk_key(FINGERPRINT, (1, 2), (3, 4), "fused", fusion_a)
    assert key_a == chunk_key(FINGERPRINT, [1, 2], [3, 4], "fused", fusion_b)
    assert model_digest("m", torch.float16) == model_digest("m", "float16")
    assert model_digest("m", "float16", config={"a": 1}) != model_digest("m", "float16", config={"a": 2})


def test_path_keys_depend_on_order_and_model_and_differ_from_chunk_keys():
    s0, c1, c2 = [1, 2], [10, 11], [20, 21]
    forward = path_key(FINGERPRINT, s0, c1, c2)
    assert forward == path_key(FINGERPRINT, (1, 2), (10, 11), (20, 21))  # same content, same key
    assert forward != path_key(FINGERPRINT, s0, c2, c1)
    assert forward != path_key(FINGERPRINT, s0, c1)
    assert forward != path_key(model_digest("tiny-test", "float16"), s0, c1, c2)
    assert path_key(FINGERPRINT, s0, c1) != chunk_key(FINGERPRINT, s0, c1, "plain")
    assert check_key(forward) == forward


def test_a_path_key_is_the_chain_of_its_block_keys():
    blocks = [[1, 2], [10, 11], [20, 21]]
    chain = path_keys(FINGERPRINT, blocks)
    assert chain[0] == path_block_key(FINGERPRINT, None, blocks[0])
    assert chain[1] == path_block_key(FINGERPRINT, chain[0], blocks[1])
    assert chain[2] == path_block_key(FINGERPRINT, chain[1], blocks[2]) == path_key(FINGERPRINT, *blocks)
    assert chain[:2] == path_keys(FINGERPRINT, blocks[:2])  # a prefix of a path keeps its keys


def test_a_path_key_depends_on_every_earlier_block_and_on_where_blocks_end():
    base = path_keys(FINGERPRINT, [[1, 2], [10, 11], [20, 21]])
    for changed in ([[1, 3], [10, 11], [20, 21]], [[1, 2], [10, 12], [20, 21]], [[1, 2], [10, 11], [20, 22]]):
        other = path_keys(FINGERPRINT, changed)
        first = next(i for i in range(3) if base[i] != other[i])
        assert all(base[i] != other[i] for i in range(first, 3)), "a change reaches every later block"
        assert base[:first] == other[:first], "and no earlier one"
    # the same token string cut into other blocks is another path
    assert path_key(FINGERPRINT, [1, 2, 10, 11], [20, 21]) != base[-1]
    assert path_key(FINGERPRINT, [1, 2], [10, 11, 20, 21]) != base[-1]
    # a block after another prefix differs even when the previous key's tokens are the same length
    assert path_block_key(FINGERPRINT, path_key(FINGERPRINT, [1, 3]), [10, 11]) != base[1]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: chunk_key("", [1], [2], "plain"), "model_fingerprint"),
        (lambda: chunk_key(FINGERPRINT, [1], [], "plain"), "at least one token"),
        (lambda: chunk_key(FINGERPRINT, [1], [2], "has space"), "variant"),
        (lambda: chunk_key(FINGERPRINT, [1], [2], "fused", {"x": float("nan")}), "NaN"),
        (lambda: chunk_key(FINGERPRINT, [1], "abc", "plain"), "string"),
        (lambda: chunk_key("f" * 63, [1], [2], "plain"), "64 lowercase hex"),
        (lambda: path_key(FINGERPRINT), "at least one segment"),
        (lambda: path_key(FINGERPRINT, [1], []), "at least one token"),
        (lambda: path_block_key(FINGERPRINT, "not-a-key", [1]), "previous"),
        (lambda: path_block_key("model", None, [1]), "model_fingerprint"),
        (lambda: model_digest("m", "notadtype"), "dtype"),
        (lambda: check_key("xyz"), "64 lowercase hex"),
    ],
)
def test_bad_key_inputs_raise_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
