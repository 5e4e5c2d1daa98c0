"""The ``tiny`` model: random weights, a byte-level tokenizer, built in memory in well under a second.

For tests and examples that exercise the engine's arithmetic without a download. Its output text is
meaningless; its logits are deterministic for a seed.
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from fusionrag_llm.models.tokenizer import CHATML_TEMPLATE

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def tiny_hf_config(family: str = "llama", **overrides: Any) -> dict[str, Any]:
    """A `transformers`-style config dict of a small model of the given family."""
    if family not in TINY_FAMILIES:
        raise ValueError(f"unknown tiny family {family!r}; choose one of {', '.join(TINY_FAMILIES)}")
    vocab = 256 + len(SPECIAL_TOKENS)
    config: dict[str, Any] = {
        "model_type": family,
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": family in ("qwen2", "qwen3"),
        "bos_token_id": 256 + SPECIAL_TOKENS.index("<|im_start|>"),
        "eos_token_id": 256 + SPECIAL_TOKENS.index("<|im_end|>"),
        "hidden_act": "silu",
    }
    if family == "mistral":
        config["sliding_window"] = None
    config.update(overrides)
    return config


def tiny_state_dict(model: torch.nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random weights for every parameter of ``model`` (norm weights near 1)."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, param in model.state_dict().items():
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * torch.randn(param.shape, generator=generator)
        elif name.endswith("embed_tokens.weight"):
            value = torch.randn(param.shape, generator=generator)
        else:
            fan_in = param.shape[-1]
            value = torch.randn(param.shape, generator=generator) / fan_in**0.5
        state[name] = value.to(param.dtype)
    return state


def byte_tokenizer() -> Any:
    """A byte-level tokenizer (one token per UTF-8 byte) with ChatML special tokens."""
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: index for index, char in enumerate(sorted(byte_chars, key=_byte_of))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))  # ids 256, 257, 258 in this order
    hf = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS),
    )
    hf.chat_template = CHATML_TEMPLATE
    return hf


def _byte_of(char: str) -> int:
    """The byte that GPT-2's byte-to-unicode table maps to ``char``."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    code = ord(char)
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]
