"""A lab method: plain chunk KV, a seeded random subset of the reused tokens recomputed.

The floor every selection rule is compared against (it was the product's ``random`` selector before
methods became plug-ins). Adding it took this one module: a ``Method`` subclass and its registration.

    python bench/methods/random_tokens.py --model tiny
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from fusionrag_llm import FusionRAG, Method, RAGRequest, register_method

TINY_ARGS = ["--model", "tiny"]


@register_method
@dataclass(frozen=True)
class RandomTokens(Method):
    name = "random_tokens"
    description = "plain KV, a seeded random subset of the reused tokens recomputed (a floor)"
    seed: int = 0

    def scores(self, inp):
        generator = torch.Generator().manual_seed(self.seed)
        return torch.rand(len(inp.layout.reused_slots), generator=generator).to(inp.layout.reused_slots.device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--out", default="bench_results", help="folder the result (random_tokens.json) goes to")
    args = parser.parse_args()
    rag = FusionRAG.from_pretrained(args.model, store=":memory:")
    chunks = [f"Passage {i}: " + "the river runs past the old mill and the town. " * 4 for i in range(3)]
    rag.add_chunks(chunks, embeddings=[[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    request = RAGRequest(chunks=chunks[::-1], question="What runs past the mill?")
    rows = {}
    for method in ("full_reuse", "random_tokens", "fusionrag"):
        out = rag.generate(request, method=method, max_new_tokens=8)
        rows[method] = {"recomputed": out.stats.recomputed_tokens, "answer": out.text}
        print(f"{method:>14}  recomputed {out.stats.recomputed_tokens:4d}  {out.text!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "random_tokens.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
