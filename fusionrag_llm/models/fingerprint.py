"""A model's identity for the KV store: config, tokenizer, weights and compute dtype."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from fusionrag_llm.storage import model_fingerprint


def weights_digest(folder: Path) -> str:
    """sha256 over the folder's safetensors files, remembered next to the files' size and mtime."""
    digest = hashlib.sha256()
    for file in sorted(folder.glob("*.safetensors")):
        digest.update(_file_digest(file).encode())
    return digest.hexdigest()


def _file_digest(file: Path) -> str:
    stat = file.stat()
    memo = file.with_name(f".{file.name}.sha256")
    stamp = f"{stat.st_size}:{stat.st_mtime_ns}"
    try:
        remembered_stamp, remembered = memo.read_text().split()
        if remembered_stamp == stamp:
            return remembered
    except (OSError, ValueError):
        pass
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    try:
        memo.write_text(f"{stamp} {digest.hexdigest()}")
    except OSError:  # a read-only model folder: hash again next time
        pass
    return digest.hexdigest()


def fingerprint_of(name: str, source: str, hf_config: dict, tokenizer_hf, dtype: torch.dtype) -> str:
    vocab = json.dumps(sorted(tokenizer_hf.get_vocab().items()))
    template = getattr(tokenizer_hf, "chat_template", "") or ""
    tokenizer_id = hashlib.sha256((vocab + template).encode()).hexdigest()
    weights = weights_digest(Path(source)) if source != "built-in" else f"built-in:{name}"
    config = {k: v for k, v in hf_config.items() if not k.startswith("_") and k != "transformers_version"}
    return model_fingerprint(name if source == "built-in" else "model", dtype, config=config,
                             tokenizer=tokenizer_id, weights=weights)  # fmt: skip
