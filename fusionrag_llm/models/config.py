"""Typed configuration of a Llama-family decoder, validated against what the engine implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from fusionrag_llm.errors import UnsupportedModelError

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # one of SUPPORTED_ROPE_TYPES
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position: int = 8192  # llama3 only


@dataclass(frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    attention_bias: bool = False  # q/k/v projection biases (Qwen2 always has them)
    qk_norm: bool = False  # per-head RMSNorm on queries and keys before rotary (Qwen3)
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def kv_shape(self) -> tuple[int, int, int]:
        """(layers, kv heads, head dim): the form of every layer stack of K or V this model reads."""
        return self.num_layers, self.num_kv_heads, self.head_dim


def config_from_hf(hf: Mapping[str, Any], model_name: str) -> ModelConfig:
    """Build a ModelConfig from a `transformers` config dict, refusing what we do not implement."""
    family = hf.get("model_type", "")
    if family not in SUPPORTED_FAMILIES:
        raise UnsupportedModelError(
            f"model {model_name!r}: architecture {family or 'unknown'!r} is not supported; "
            f"supported families: {', '.join(SUPPORTED_FAMILIES)}"
        )
    _check_unsupported_features(hf, model_name)
    num_heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    eos = hf.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
    return ModelConfig(
        family=family,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(hf.get("head_dim") or hidden // num_heads),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope=_rope_from_hf(hf, model_name),
        attention_bias=family == "qwen2" or bool(hf.get("attention_bias", False)),
        qk_norm=family == "qwen3",
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )


def _check_unsupported_features(hf: Mapping[str, Any], model_name: str) -> None:
    def refuse(feature: str) -> None:
        raise UnsupportedModelError(f"model {model_name!r}: {feature} is not supported by the engine")

    window = hf.get("sliding_window")
    uses_window = hf.get("use_sliding_window", hf.get("model_type") == "mistral")
    max_pos = int(hf.get("max_position_embeddings", 2048))
    if uses_window and window is not None and int(window) < max_pos:
        refuse(f"sliding-window attention (window {window} < context {max_pos})")
    if hf.get("mlp_bias"):
        refuse("MLP biases")
    if hf.get("hidden_act", "silu") != "silu":
        refuse(f"activation {hf.get('hidden_act')!r} (only 'silu')")
    if hf.get("kv_lora_rank") or hf.get("q_lora_rank"):
        refuse("multi-head latent attention (MLA)")
    if hf.get("num_experts") or hf.get("num_local_experts"):
        refuse("mixture-of-experts layers")
    layer_types = hf.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        refuse(f"layer types {sorted(set(layer_types))} (only 'full_attention')")


def _rope_from_hf(hf: Mapping[str, Any], model_name: str) -> RopeConfig:
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    theta = float(scaling.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if kind not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"model {model_name!r}: rope scaling type {kind!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModelError(f"model {model_name!r}: partial rotary embedding is not supported")
    return RopeConfig(
        theta=theta,
        kind=kind,
        factor=float(scaling.get("factor", 1.0)),
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position=int(scaling.get("original_max_position_embeddings", 8192)),
    )
