"""Convert a ``.gguf`` file once into a fast-loading folder (config.json, safetensors, tokenizer).

GGUF weights are quantised and stored in llama.cpp's layout; `transformers` knows how to
dequantise and un-permute them, so the conversion runs it once and caches the result. Later loads
read the safetensors folder directly (seconds, memory-mapped).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from fusionrag_llm.errors import UnsupportedModelError
from fusionrag_llm.paths import cache_dir

logger = logging.getLogger(__name__)

COMPLETE_MARKER = ".fusionrag-complete"


def converted_gguf_folder(gguf_path: Path, target: Path | None = None) -> Path:
    """The cached conversion of ``gguf_path``, converting it first when absent."""
    if target is None:
        target = cache_dir() / "models" / f"gguf-{_file_identity(gguf_path)}"
    if (target / COMPLETE_MARKER).is_file():
        return target
    convert_gguf(gguf_path, target)
    return target


def _file_identity(path: Path) -> str:
    stat = path.stat()
    text = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantise ``gguf_path`` to float32 safetensors in ``target`` (atomic: all or nothing)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.warning("converting %s once into %s (later loads take seconds)", gguf_path.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        folder, name = str(gguf_path.parent), gguf_path.name
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        except (ValueError, KeyError, NotImplementedError) as exc:
            raise UnsupportedModelError(f"GGUF file {str(gguf_path)!r} cannot be converted: {exc}") from None
        _save_plain(model, staging)
        tokenizer.save_pretrained(staging)
        (staging / COMPLETE_MARKER).write_text(str(gguf_path))
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _save_plain(model, folder: Path) -> None:
    """Write weights and config without the quantisation wrapper (it refuses to serialise)."""
    from safetensors.torch import save_file

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tied = bool(config.get("tie_word_embeddings"))
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(folder / "model.safetensors"))


def _publish(staging: Path, target: Path) -> None:
    """Move a finished folder into place; a concurrent converter that finished first wins."""
    if target.exists() and not (target / COMPLETE_MARKER).is_file():
        shutil.rmtree(target, ignore_errors=True)  # debris of an interrupted conversion
    try:
        os.rename(staging, target)
    except OSError:
        if not (target / COMPLETE_MARKER).is_file():
            raise
