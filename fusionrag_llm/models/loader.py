"""Load a Llama-family model by name, folder, ``.gguf`` file or hub id onto a device and dtype.

Names mean what they say. A path that exists is always loaded as a path, even one called ``tiny``
or ``smollm2-135m``: a user's folder must never be swapped for a built-in model (the random-weight
``tiny`` would then answer, and fill the store, in its place). Otherwise a built-in name matches
whole, ignoring case (``"Tiny"``, ``"SmolLM2-135M"``), never by prefix: ``tinyllama`` or a missing
``tiny_model/`` folder is an unknown model, not the test model. A ``pathlib.Path`` is always a path.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fusionrag_llm.errors import FusionRAGError, ModelNotFoundError
from fusionrag_llm.models.config import config_from_hf
from fusionrag_llm.models.llama import DECODE_WEIGHTS, DecoderLM
from fusionrag_llm.models.tokenizer import ChatTokenizer

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
TINY_NAMES = ("tiny", "tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3")
MODEL_NAMES = ("smollm2-135m", *TINY_NAMES)


@dataclass
class LoadedModel:
    name: str
    model: DecoderLM
    tokenizer: ChatTokenizer
    hf_config: dict[str, Any]
    source: str  # the folder the weights came from, or "built-in"

    @property
    def context_window(self) -> int:
        return self.model.cfg.max_position_embeddings


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise FusionRAGError(f"device {device!r} is not valid; use 'cpu', 'cuda' or 'cuda:N'") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise FusionRAGError("device 'cuda' was asked for but no CUDA device is available; use 'cpu'")
    if resolved.type not in ("cpu", "cuda"):
        raise FusionRAGError(f"device type {resolved.type!r} is not supported; use 'cpu' or 'cuda'")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``dtype`` by name or torch dtype; None: float32 on the CPU, bfloat16 on a GPU that computes in it
    (compute capability 8.0 and later), else float16. bfloat16 asked for on an older GPU is refused."""
    if dtype is None:
        if device.type != "cuda":
            return torch.float32
        if _native_bfloat16(device):
            return torch.bfloat16
        logger.info("%s has no bfloat16 arithmetic: the model computes in float16", _card(device))
        return torch.float16
    resolved = None
    if isinstance(dtype, torch.dtype):
        resolved = dtype if dtype in DTYPES.values() else None
    elif isinstance(dtype, str):
        resolved = DTYPES.get(DTYPE_ALIASES.get(dtype.lower(), dtype.lower()))
    if resolved is None:
        raise FusionRAGError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    if resolved == torch.bfloat16 and device.type == "cuda" and not _native_bfloat16(device):
        raise FusionRAGError(f"{_card(device)} has no bfloat16 arithmetic (it needs compute capability 8.0 or "
                             "later); use dtype float16 or float32")  # fmt: skip
    return resolved


def _native_bfloat16(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (8, 0)


def _card(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"


def load_model(name_or_path: str | Path, device=None, dtype=None, kernels: str | None = None,
               decode_weights: str | None = None) -> LoadedModel:  # fmt: skip
    """Resolve ``name_or_path`` (see ``MODEL_NAMES``, a folder, a ``.gguf`` file or a hub id) and load it.

    An existing path always wins over a built-in name; built-in names match whole, ignoring case.

    ``kernels``: ``"auto"`` (Triton on CUDA of compute capability 8.0+, else torch), ``"torch"`` or
    ``"triton"`` (on CPU only under ``TRITON_INTERPRET=1``); default ``$FUSIONRAG_KERNELS`` or ``"auto"``.
    Chosen once here.
    A float32 model on CPU also gets its linear weights packed for oneDNN (``DecoderLM.pack_linears``:
    faster decode steps for a second copy of the weights; ``model.unpack_linears()`` frees it).
    ``decode_weights``: what decode steps read on CPU, ``"auto"``, ``"float"``, ``"q8"`` or ``"q4"``
    (``DecoderLM.quantize_linears``); default ``$FUSIONRAG_DECODE_WEIGHTS`` or ``"auto"`` (4-bit or
    8-bit blocks only where they are the weights' own numbers, as in a model converted from a GGUF file).
    """
    from fusionrag_llm.kernels.dispatch import resolve_backend

    decode_weights = decode_weights or os.environ.get("FUSIONRAG_DECODE_WEIGHTS") or "auto"
    if decode_weights not in DECODE_WEIGHTS:
        raise FusionRAGError(f"decode_weights must be one of {', '.join(DECODE_WEIGHTS)}, got {decode_weights!r}")
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    try:
        backend = resolve_backend(torch.empty(0, device=torch_device), kernels)
    except ValueError as exc:
        raise FusionRAGError(f"kernels: {exc}") from None
    name = str(name_or_path)
    builtin = builtin_name(name_or_path)
    if builtin in TINY_NAMES:
        loaded = _load_tiny(builtin, torch_device, torch_dtype)
    else:
        loaded = load_folder(resolve_model_folder(name_or_path), builtin or name, torch_device, torch_dtype)
    loaded.model.kernels = backend
    if torch_device.type == "cuda":
        loaded.model.fuse_projections()
    loaded.model.pack_linears()
    loaded.model.quantize_linears(decode_weights)
    loaded.model.compiled_decode = compiled_decode_setting()
    return loaded


def compiled_decode_setting() -> bool:
    """``$FUSIONRAG_COMPILED_DECODE``: "1" (default) lets decode steps run as one compiled call where
    they can (``models/fast_decode.py``), "0" runs them layer by layer."""
    value = os.environ.get("FUSIONRAG_COMPILED_DECODE", "1").strip()
    if value not in ("0", "1"):
        raise FusionRAGError(f"FUSIONRAG_COMPILED_DECODE must be 0 or 1, got {value!r}")
    return value == "1"


def builtin_name(name_or_path: str | Path) -> str | None:
    """The built-in model ``name_or_path`` names, lower-cased, or None (a path, hub id or unknown name).

    >>> builtin_name("Tiny"), builtin_name("tinyllama"), builtin_name(Path("tiny"))
    ('tiny', None, None)
    """
    from fusionrag_llm.models.default_model import DEFAULT_ALIASES, DEFAULT_MODEL

    if isinstance(name_or_path, Path) or _is_existing_path(name_or_path):
        return None
    name = name_or_path.lower()
    if name in DEFAULT_ALIASES:
        return DEFAULT_MODEL
    return name if name in TINY_NAMES else None


def _is_existing_path(name: str) -> bool:
    return bool(name) and Path(name).expanduser().exists()


def resolve_model_folder(name_or_path: str | Path) -> Path:
    """A local folder holding config.json, safetensors weights and the tokenizer for ``name_or_path``."""
    from fusionrag_llm.models.default_model import resolve_default_model

    name = str(name_or_path)
    if not name.strip():
        raise ModelNotFoundError(f"the model name is empty: use one of {', '.join(MODEL_NAMES)} or a path")
    if _is_existing_path(name):
        return _local_model_folder(Path(name).expanduser(), name)
    if builtin_name(name_or_path) is not None:
        return resolve_default_model()
    if not isinstance(name_or_path, Path) and _looks_like_hub_id(name):
        return _download_from_hub(name)
    raise ModelNotFoundError(
        f"unknown model {name!r}: no file or folder exists at that path, and it is none of "
        f"{', '.join(MODEL_NAMES)} (built-in names match whole, ignoring case) nor a hub id like "
        "'HuggingFaceTB/SmolLM2-135M-Instruct'"
    )


def _local_model_folder(path: Path, name: str) -> Path:
    from fusionrag_llm.models.gguf import converted_gguf_folder

    if path.is_file() and path.suffix == ".gguf":
        return converted_gguf_folder(path)
    hint = f" (a path that exists is always read as a path, even one named like the built-in {name!r})" \
        if path.name.lower() in MODEL_NAMES else ""  # fmt: skip
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"folder {str(path)!r} has no config.json; it is not a model folder{hint}")
        return path
    raise ModelNotFoundError(f"{name!r} is neither a model folder nor a .gguf file{hint}")


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


def _download_from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as exc:  # the hub client raises many types: offline, gated, missing repo
        raise ModelNotFoundError(
            f"model {repo_id!r} is not a local path and could not be fetched from the model hub "
            f"({type(exc).__name__}: {exc}); pass a local folder, a .gguf file, or one of {', '.join(MODEL_NAMES)}"
        ) from None


def load_folder(folder: Path, name: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    hf_config = json.loads((folder / "config.json").read_text())
    cfg = config_from_hf(hf_config, name)
    state = _read_safetensors(folder, name)
    model = _instantiate(cfg, state, device, dtype)
    tokenizer = ChatTokenizer(_load_hf_tokenizer(folder, name), cfg.eos_token_ids)
    logger.info("loaded %s from %s (%s, %s)", name, folder, device, dtype)
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, hf_config=hf_config, source=str(folder))


def _read_safetensors(folder: Path, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"model {name!r}: no .safetensors weights in {str(folder)!r}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def _instantiate(cfg, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype) -> DecoderLM:
    with torch.device("meta"):
        model = DecoderLM(cfg)
    expected = model.state_dict().keys()
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing = [key for key in expected if key not in state]
    if missing:
        raise FusionRAGError(f"model weights are missing {len(missing)} tensors, e.g. {missing[:3]}")
    model.load_state_dict({key: state[key].to(dtype) for key in expected}, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device).eval()


# tokenizer classes AutoTokenizer builds as they are named: loaded directly, without its ~2 s of resolving
# the model's config (the GGUF conversions and Llama 3's folders name one of these)
GENERIC_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")


def _load_hf_tokenizer(folder: Path, name: str) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        declared = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        declared = None
    try:
        if declared in GENERIC_TOKENIZERS:
            return PreTrainedTokenizerFast.from_pretrained(str(folder))
        return AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"model {name!r}: could not load its tokenizer from {str(folder)!r}: {exc}") from None


def _load_tiny(name: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """``name`` is one of ``TINY_NAMES``: ``tiny`` is the Llama one."""
    from fusionrag_llm.models.tiny import byte_tokenizer, tiny_hf_config, tiny_state_dict

    family = name.partition("-")[2] or "llama"
    hf_config = tiny_hf_config(family)
    cfg = config_from_hf(hf_config, name)
    with torch.device("meta"):
        skeleton = DecoderLM(cfg)
    model = _instantiate(cfg, tiny_state_dict(skeleton), device, dtype)
    tokenizer = ChatTokenizer(byte_tokenizer(), cfg.eos_token_ids)
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, hf_config=hf_config, source="built-in")


def check_auxiliary_model(auxiliary: LoadedModel, main: LoadedModel) -> DecoderLM:
    """``auxiliary``'s model, when it can stand in for ``main`` in CacheClip's selection: the same
    tokenizer (it reads the very token ids of the prompt) on the same device; else ``FusionRAGError``."""
    if auxiliary.tokenizer.hf.get_vocab() != main.tokenizer.hf.get_vocab():
        raise FusionRAGError(
            f"the auxiliary model {auxiliary.name!r} does not share the tokenizer of {main.name!r}: CacheClip's "
            "auxiliary model reads the prompt's own token ids, so it needs the same vocabulary"
        )
    if auxiliary.model.device != main.model.device:
        raise FusionRAGError(f"the auxiliary model is on {auxiliary.model.device}, the model on {main.model.device}; "
                             "load both on one device")  # fmt: skip
    return auxiliary.model
