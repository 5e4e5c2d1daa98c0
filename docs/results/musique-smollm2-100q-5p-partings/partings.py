"""Where greedy answers part from Full Attention's, over the stored records of several runs.

Full Attention's margins (top-1 minus top-2 probability at each of its answer tokens) come from a
`bench quality` run that records them (its quality.json or its partial log); every other record is
read from the runs named after it (quality.json files or partial logs) (same questions, passages, neighbours and 16 new tokens, so the same Full
Attention answers) and, optionally, the bfloat16 Full Attention answers of `bf16_floor.py`, labelled
`full_attention_bf16`. Prints the `partings` table of `eval/quality_diagnostics.py` over all of them.

    python partings.py MARGINS_RUN [OTHER_RUN ...] [--bf16 FA_BF16_JSONL]
"""

import json
import sys

from fusionrag_llm.eval.quality_diagnostics import partings, partings_markdown


def main(argv: list[str]) -> None:
    bf16 = argv[argv.index("--bf16") + 1] if "--bf16" in argv else None
    paths = [a for a in argv if a != "--bf16" and a != bf16]
    base = _records(paths[0])
    fa = {r["qid"]: r for r in base if r["method"] == "full_attention"}
    records, seen = list(base), {(r["qid"], r["method"], r["ratio"]) for r in base}
    for path in paths[1:]:
        for r in _records(path):
            key = (r["qid"], r["method"], r["ratio"])
            if r["method"] == "full_attention":  # same prompts and settings: the same answer
                assert r["qid"] not in fa or r["token_ids"] == fa[r["qid"]]["token_ids"], r["qid"]
            elif key not in seen and r["qid"] in fa:
                records.append(r)
                seen.add(key)
    if bf16:
        for line in open(bf16):
            r = json.loads(line)
            if r["qid"] in fa:
                records.append({"qid": r["qid"], "method": "full_attention_bf16", "ratio": None, "token_ids": r["token_ids"]})
    print(partings_markdown(partings(records)))


def _records(path: str) -> list[dict]:
    """A run's records: from its quality.json, or from its partial log (one JSON object per line)."""
    if path.endswith(".jsonl"):
        return [r for r in map(json.loads, open(path)) if "method" in r]
    return json.load(open(path))["records"]


if __name__ == "__main__":
    main(sys.argv[1:])
