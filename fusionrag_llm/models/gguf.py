"""Convert a ``.gguf`` file once into a fast-loading folder (config.json, safetensors, tokenizer).

GGUF weights are quantised and stored in llama.cpp's layout; `transformers` knows how to
dequantise and un-permute them, so the conversion runs it once and caches the result. Later loads
read the safetensors folder directly (seconds, memory-mapped).

A conversion is tied to the *content* of its GGUF: the folder is named after the file's sha256 and
its completion marker records that digest. A GGUF replaced by another one of the same size and
mtime (``cp -p``, ``tar -x``, rsync) is converted afresh instead of loading the old model; the
digest is memoised as ``fingerprint.file_digest`` explains, so the check costs a stat per load.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from fusionrag_llm.errors import FusionRAGError, UnsupportedModelError
from fusionrag_llm.models.fingerprint import file_digest
from fusionrag_llm.paths import cache_dir

logger = logging.getLogger(__name__)

COMPLETE_MARKER = ".fusionrag-complete"


def converted_gguf_folder(gguf_path: Path, target: Path | None = None) -> Path:
    """The cached conversion of ``gguf_path``'s current content, converting it first when absent."""
    digest = file_digest(gguf_path)
    if target is None:
        target = cache_dir() / "models" / f"gguf-{digest[:16]}"
    if conversion_source(target) != digest:
        convert_gguf(gguf_path, target, digest)
    return target


def conversion_source(folder: Path) -> str | None:
    """The sha256 of the GGUF that ``folder`` is a complete conversion of (None: incomplete or older format)."""
    try:
        digest = json.loads((folder / COMPLETE_MARKER).read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return digest if isinstance(digest, str) else None


def convert_gguf(gguf_path: Path, target: Path, digest: str | None = None) -> None:
    """Dequantise ``gguf_path`` (whose sha256 is ``digest``) to float32 safetensors in ``target``.

    Atomic: all or nothing. A ``target`` converted from another GGUF is replaced.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    digest = digest or file_digest(gguf_path)
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
        _check_unchanged(gguf_path, digest)
        (staging / COMPLETE_MARKER).write_text(json.dumps({"source": str(gguf_path), "sha256": digest}))
        _publish(staging, target, digest)
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


def _check_unchanged(gguf_path: Path, digest: str) -> None:
    """The marker would claim ``digest`` for what was read: refuse if the file changed meanwhile."""
    if file_digest(gguf_path) != digest:
        raise FusionRAGError(f"GGUF file {str(gguf_path)!r} changed while it was being converted; load it again")


def _publish(staging: Path, target: Path, digest: str) -> None:
    """Move a finished folder into place; a concurrent converter of the same GGUF that finished first wins."""
    if target.exists() and conversion_source(target) != digest:
        _discard(target)  # debris of an interrupted conversion, or the conversion of a replaced GGUF
    try:
        os.rename(staging, target)
    except OSError:
        if conversion_source(target) != digest:
            raise


def _discard(folder: Path) -> None:
    """Remove ``folder``: renamed aside first, so no reader ever sees it half deleted under its name."""
    aside = folder.with_name(f".discarded-{folder.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(folder, aside)
    except FileNotFoundError:  # another process discarded it first
        return
    shutil.rmtree(aside, ignore_errors=True)
