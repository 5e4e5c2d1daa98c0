"""EPIC (LegoLink): plain chunk KV; recompute the first tokens of every chunk, where a chunk encoded
alone put its attention sinks (``fusion/scorers/chunk_starts.py``; no forward pass)."""

from __future__ import annotations

from dataclasses import dataclass

from fusionrag_llm.fusion.scorers import chunk_starts
from fusionrag_llm.methods.base import Method


@dataclass(frozen=True)
class Epic(Method):
    name = "epic"
    description = "plain KV, recompute the first tokens of every chunk (EPIC's LegoLink)"

    def scores(self, inp):
        return chunk_starts.scores(inp)
