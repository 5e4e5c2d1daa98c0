"""The kv_codec table of docs/BENCHMARKS.md from the quality runs' records.

    python docs/results/kv_codec/table.py docs/results/kv_codec_3p_{float32,bf16,int8,fp8,int4}

The first folder is the reference (float32). Per run (labelled by the folder name's part after
`kv_codec_3p_`) and method/ratio: bytes per token of the run's store (`run.store`), mean KL to Full
Attention, `norm KL vs float32 FR` (1 - KL / the float32 run's Full Reuse KL: one yardstick for every
codec), greedy EM (the first new tokens equal Full Attention's), and per question against the
reference run's same method and ratio: how many questions are further from Full Attention (by more
than 1e-4) and the largest increase.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def records(folder: Path) -> dict[tuple[str, float | None], dict[str, dict]]:
    """Per (method, ratio): each question's record from the run's log."""
    found: dict[tuple[str, float | None], dict[str, dict]] = {}
    lines = (folder / "quality.partial.jsonl").read_text().splitlines()[1:]
    for line in lines:
        record = json.loads(line)
        found.setdefault((record["method"], record["ratio"]), {})[record["qid"]] = record
    return found


def main(folders: list[str]) -> None:
    paths = [Path(f) for f in folders]
    reference = records(paths[0])
    fr_kl = sum(r["kl"] for r in reference["full_reuse", None].values()) / len(reference["full_reuse", None])
    print("| kv_codec | bytes/token | method | r | n | mean KL | norm KL vs float32 FR | greedy EM | "
          "questions further than float32 (max increase) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in paths:
        label = path.name.removeprefix("kv_codec_3p_")
        store = json.loads((path / "quality.json").read_text())["run"].get("store", {})
        size = store.get("entry_bytes_per_token")
        for (method, ratio), by_question in sorted(records(path).items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            if method == "full_attention":
                continue
            kls = [r["kl"] for r in by_question.values()]
            mean = sum(kls) / len(kls)
            greedy = sum(r["greedy_em"] for r in by_question.values()) / len(kls)
            base = reference.get((method, ratio), {})
            deltas = [r["kl"] - base[q]["kl"] for q, r in by_question.items() if q in base]
            worse = sum(d > 1e-4 for d in deltas)
            versus = "-" if path == paths[0] else f"{worse}/{len(deltas)} (+{max(deltas):.4f})"
            print(f"| {label} | {size:,.0f} | {method} | {'-' if ratio is None else ratio} | {len(kls)} | {mean:.4f} | "
                  f"{1 - mean / fr_kl:.3f} | {greedy:.2f} | {versus} |")


if __name__ == "__main__":
    main(sys.argv[1:])
