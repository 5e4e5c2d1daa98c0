"""Quickstart: register a few passages, then answer with full attention and with FusionRAG.

    python cookbook/quickstart.py            # SmolLM2-135M-Instruct (the embedded default)
    python cookbook/quickstart.py --model tiny
"""

import argparse

from fusionrag_llm import FusionRAG, RAGRequest

PASSAGES = [
    "Varrow is a windswept island in the Northern Sea. Its only town, Keldmouth, sits on a natural harbour.",
    "The Keldmouth lighthouse was built in 1872 by the engineer Tamsin Orrery.",
    "Tamsin Orrery was born in the mainland city of Brightwater in 1831.",
    "Brightwater lies at the mouth of the river Sel and is the capital of the province of Lowmarch.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    rag = FusionRAG.from_pretrained(args.model, store=":memory:")
    rag.add_chunks(PASSAGES, neighbors=2)  # offline: plain and fused KV of each passage
    request = RAGRequest(chunks=PASSAGES[1:], question="In which province was the lighthouse engineer born?")
    for method in ("fusionrag", "full_attention"):  # full attention stores an exact path, so it goes last
        out = rag.generate(request, method=method, recompute_ratio=0.15, max_new_tokens=24)
        s = out.stats
        print(f"{method:>15}: TTFT {s.ttft_s * 1000:.0f} ms, {s.reused_tokens} reused / "
              f"{s.recomputed_tokens} recomputed tokens -> {out.text.strip()!r}")


if __name__ == "__main__":
    main()
