"""Rotary position embedding at arbitrary absolute positions.

Keys are stored without rotary embedding (position-free) so a chunk entry can be placed anywhere;
``DecoderLM.rotate`` turns them (or queries) to the positions they take in an assembled prompt,
through ``fusionrag_llm.kernels.rotary`` (Triton or its torch reference). This module only derives
the inverse frequencies of a model's rope configuration.
"""

from __future__ import annotations

import math

import torch

from fusionrag_llm.kernels.rotary import rotary_cos_sin
from fusionrag_llm.models.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies, with the configured scaling applied."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.kind == "linear":
        return inv_freq / rope.factor
    if rope.kind == "llama3":
        return _llama3_scaled(inv_freq, rope)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    old_len = rope.original_max_position
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryTable:
    """Computes cos/sin for any positions; cheap enough to evaluate per call."""

    def __init__(self, rope: RopeConfig, head_dim: int, device: torch.device | str = "cpu"):
        self.inv_freq = inverse_frequencies(rope, head_dim).to(device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [n, head_dim] for positions [n], in ``dtype``."""
        return rotary_cos_sin(positions, self.inv_freq, dtype)
