"""Full Reuse (TurboRAG, PromptCache): every chunk's plain KV as it is, positions corrected, nothing recomputed."""

from __future__ import annotations

from dataclasses import dataclass

from fusionrag_llm.methods.base import Method


@dataclass(frozen=True)
class FullReuse(Method):
    name = "full_reuse"
    description = "reuse every chunk's plain KV, positions corrected (TurboRAG)"
    default_ratio = 0.0
