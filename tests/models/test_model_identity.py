"""A model is what its files hold and what its name says: never another model's weights or KV entries.

Replacing a file by another of the same size and with the old mtime (what ``cp -p``, ``tar -x`` and
rsync do) must change the weights digest, the KV store fingerprint and the GGUF conversion. Model
names match whole; a path that exists is always loaded as a path.
"""

import ast
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from fusionrag_llm import FusionRAG
from fusionrag_llm.errors import ModelNotFoundError
from fusionrag_llm.models import default_model, fingerprint, gguf
from fusionrag_llm.models.config import config_from_hf
from fusionrag_llm.models.fingerprint import file_digest, model_digest, weights_digest
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.models.loader import TINY_NAMES, load_model
from fusionrag_llm.models.tiny import byte_tokenizer, tiny_hf_config, tiny_state_dict

SETTLE_S = 0.1  # files older than fingerprint.RACY_SECONDS (patched to half this) get a memo


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Digest memos and conversions go to a fresh cache; a short racy window keeps the tests fast."""
    monkeypatch.setenv("FUSIONRAG_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fingerprint, "RACY_SECONDS", SETTLE_S / 2)


def replace_keeping_times(path: Path, data: bytes, in_place: bool) -> None:
    """New bytes under ``path`` with its old atime/mtime, as ``cp -p`` (in place) or ``tar -x`` (new inode)."""
    old = path.stat()
    assert len(data) == old.st_size, "the replacement must have the same size"
    if in_place:
        with open(path, "r+b") as handle:
            handle.write(data)
    else:
        fresh = path.with_name(path.name + ".new")
        fresh.write_bytes(data)
        os.replace(fresh, path)
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert path.stat().st_size == old.st_size and path.stat().st_mtime_ns == old.st_mtime_ns


def settled_file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    time.sleep(SETTLE_S)
    return path


def memo_files(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "cache" / "digests"
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


@pytest.mark.parametrize("in_place", [True, False], ids=["cp-p-in-place", "new-inode"])
def test_same_size_and_mtime_with_other_bytes_changes_the_digest(tmp_path, in_place):
    weights = settled_file(tmp_path / "model.safetensors", b"A" * 4096)
    first = file_digest(weights)
    assert memo_files(tmp_path), "a settled file's digest should be remembered"
    assert file_digest(weights) == first  # from the memo
    replace_keeping_times(weights, b"B" * 4096, in_place)
    assert file_digest(weights) != first
    assert file_digest(weights) == file_digest(settled_file(tmp_path / "copy", b"B" * 4096))


def test_a_memo_never_vouches_for_another_file(tmp_path):
    first = settled_file(tmp_path / "a.safetensors", b"A" * 4096)
    second = settled_file(tmp_path / "b.safetensors", b"B" * 4096)
    os.utime(second, ns=(first.stat().st_atime_ns, first.stat().st_mtime_ns))
    digest_a = file_digest(first)
    (memo_a,) = memo_files(tmp_path)
    second_memo = fingerprint._memo_path(second)
    second_memo.write_text(memo_a.read_text())  # a user copies or edits memos: same size and mtime
    assert file_digest(second) != digest_a
    second_memo.write_text("garbage")
    assert file_digest(second) == file_digest(settled_file(tmp_path / "c", b"B" * 4096))


def test_a_file_changed_just_before_hashing_is_not_remembered(tmp_path, monkeypatch):
    monkeypatch.setattr(fingerprint, "RACY_SECONDS", 2.0)
    (tmp_path / "fresh.safetensors").write_bytes(b"A" * 64)
    file_digest(tmp_path / "fresh.safetensors")
    assert memo_files(tmp_path) == []  # a change within the clock's tick could hide behind its stamp


# ------------------------------------------------------------------ a real model folder


def save_tiny_folder(folder: Path, seed: int) -> Path:
    """The ``tiny`` model's architecture and tokenizer as a model folder, weights drawn with ``seed``."""
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_hf_config("llama")
    (folder / "config.json").write_text(json.dumps(config))
    with torch.device("meta"):
        skeleton = DecoderLM(config_from_hf(config, "tiny"))
    save_file(tiny_state_dict(skeleton, seed=seed), str(folder / "model.safetensors"))
    byte_tokenizer().save_pretrained(str(folder))
    return folder


def weights_bytes(seed: int, scratch: Path) -> bytes:
    return (save_tiny_folder(scratch / f"seed{seed}", seed) / "model.safetensors").read_bytes()


@pytest.mark.parametrize("in_place", [True, False], ids=["cp-p-in-place", "new-inode"])
def test_replaced_weights_never_reuse_the_old_models_kv(tmp_path, in_place):
    folder = save_tiny_folder(tmp_path / "model", seed=0)
    time.sleep(SETTLE_S)
    store, texts = tmp_path / "store", ["The harbour holds forty boats.", "The ferry leaves at noon."]
    old = FusionRAG.from_pretrained(str(folder), store=store, options={"prefix_cache": False})
    old.add_chunks(texts, embeddings=[[1.0, 0.0], [0.0, 1.0]])
    before = weights_digest(folder)
    replace_keeping_times(folder / "model.safetensors", weights_bytes(1, tmp_path / "scratch"), in_place)
    new = FusionRAG.from_pretrained(str(folder), store=store, options={"prefix_cache": False})
    assert weights_digest(folder) != before
    assert new.fingerprint != old.fingerprint
    report = new.add_chunks(texts, embeddings=[[1.0, 0.0], [0.0, 1.0]])
    assert report.plain_computed == 2 and report.fused_computed == 2  # none of the old model's entries


# ------------------------------------------------------------------ the fingerprint's layering
MODELS_DIR = Path(__file__).resolve().parents[2] / "fusionrag_llm" / "models"
# fingerprints made before the digest moved to models/: stores written then keep their entries
KNOWN_DIGEST = "26cf719af1a0bcd9d8ec3ae14df680f91bb37a0550a65c8f95e4518b7854c0fe"


def test_a_models_fingerprint_is_what_it_was_for_the_same_inputs():
    fields = dict(config={"a": 1}, tokenizer="t", weights="w")
    assert model_digest("m", "float32", **fields) == KNOWN_DIGEST
    assert model_digest("m", torch.float32) == model_digest("m", "float32") != model_digest("m", "bfloat16")
    with pytest.raises(ValueError, match="dtype"):
        model_digest("m", "notadtype")


def test_models_do_not_import_the_store():
    """The store takes a fingerprint as an opaque digest; the model side never needs its key scheme."""
    for path in MODELS_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            assert not any(n.startswith("fusionrag_llm.storage") for n in names), f"{path.name} imports {names}"


# ------------------------------------------------------------------ GGUF conversions


@pytest.fixture
def fake_converter(monkeypatch):
    """Conversion without transformers: the "model" is the GGUF's bytes, saved as ``weights.bin``."""

    class Tokenizer:
        def save_pretrained(self, folder):
            Path(folder, "tokenizer.json").write_text("{}")

    def read_gguf(folder, gguf_file, **kwargs):
        return Path(folder, gguf_file).read_bytes()

    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: Tokenizer())
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", read_gguf)
    monkeypatch.setattr(gguf, "_save_plain", lambda model, folder: Path(folder, "weights.bin").write_bytes(model))


@pytest.mark.parametrize("explicit_target", [False, True])
def test_a_replaced_gguf_is_converted_again(tmp_path, fake_converter, explicit_target):
    source = settled_file(tmp_path / "model.gguf", b"GGUF" + b"A" * 60)
    target = tmp_path / "converted" if explicit_target else None
    first = gguf.converted_gguf_folder(source, target)
    assert (first / "weights.bin").read_bytes() == source.read_bytes()
    replace_keeping_times(source, b"GGUF" + b"B" * 60, in_place=True)
    second = gguf.converted_gguf_folder(source, target)
    assert (second / "weights.bin").read_bytes() == b"GGUF" + b"B" * 60
    assert gguf.converted_gguf_folder(source, target) == second  # and then reused


def test_the_default_model_follows_a_replaced_package_gguf(tmp_path, fake_converter, monkeypatch):
    (tmp_path / "pkg").mkdir()
    source = settled_file(tmp_path / "pkg" / "model.gguf", b"GGUF" + b"A" * 60)
    monkeypatch.setattr(default_model, "installed_gguf", lambda: source)
    folder = default_model.resolve_default_model(cache=tmp_path / "cache")
    assert (folder / "weights.bin").read_bytes() == source.read_bytes()
    replace_keeping_times(source, b"GGUF" + b"B" * 60, in_place=False)
    again = default_model.resolve_default_model(cache=tmp_path / "cache")
    assert again == folder and (again / "weights.bin").read_bytes() == b"GGUF" + b"B" * 60


# ------------------------------------------------------------------ names mean what they say


@pytest.mark.parametrize("name", ["tinyllama", "tiny_model/", "./tiny", "tiny-gpt2", "tiny "])
def test_names_that_only_start_like_a_builtin_are_unknown(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError, match="unknown model") as caught:
        load_model(name)
    assert "tiny" in str(caught.value) and "smollm2-135m" in str(caught.value)


def test_a_path_object_is_never_a_builtin_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError, match="unknown model 'tiny'"):
        load_model(Path("tiny"))


@pytest.mark.parametrize("name", ["tiny", "Tiny", "TINY-QWEN3", "tiny-mistral"])
def test_builtin_names_match_whole_ignoring_case(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    loaded = load_model(name)
    assert loaded.source == "built-in" and loaded.name == name.lower() and loaded.name in TINY_NAMES


@pytest.mark.parametrize("folder_name, asked", [("tiny", "tiny"), ("tiny", "./tiny"), ("smollm2-135m", "smollm2-135m")])
def test_an_existing_folder_is_loaded_as_a_folder_whatever_its_name(tmp_path, monkeypatch, folder_name, asked):
    monkeypatch.chdir(tmp_path)
    save_tiny_folder(tmp_path / folder_name, seed=1)
    loaded = load_model(asked)
    assert Path(loaded.source).resolve() == (tmp_path / folder_name).resolve()
    builtin = load_model("tiny-llama")  # same architecture, seed-0 weights
    assert not torch.equal(loaded.model.model.embed_tokens.weight, builtin.model.model.embed_tokens.weight)


def test_an_existing_non_model_folder_named_tiny_says_why_it_is_not_the_builtin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()
    with pytest.raises(ModelNotFoundError, match="no config.json.*always read as a path"):
        load_model("tiny")
    shutil.rmtree(tmp_path / "tiny")
    assert load_model("tiny").source == "built-in"
