"""Full Attention: the exact prefill of the whole prompt, the baseline every method is measured against."""

from __future__ import annotations

from dataclasses import dataclass

from fusionrag_llm.methods.base import Method


@dataclass(frozen=True)
class FullAttention(Method):
    name = "full_attention"
    description = "exact prefill of the whole prompt (the baseline)"
    default_ratio = 1.0
    chunk_kv = None
