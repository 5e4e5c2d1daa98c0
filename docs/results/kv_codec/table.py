"""The kv_codec table of docs/BENCHMARKS.md from the quality runs' JSON.

    python docs/results/kv_codec/table.py docs/results/kv_codec_{float32,bf16,int8,fp8,int4}

Per codec (the run's `config.kv_codec`) and method/ratio: mean KL to Full Attention, the bench's
`norm KL` (normalised by that run's own Full Reuse, which reads the same codec's entries) and
`norm KL vs float32 FR` (normalised by the float32 run's Full Reuse, one yardstick for every codec),
with the store's measured bytes per token (`run.store`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folders: list[str]) -> None:
    runs = [json.loads((Path(f) / "quality.json").read_text()) for f in folders]
    reference = next((r for r in runs if r["config"].get("kv_codec") == "float32"), None)
    fr_kl = None if reference is None else next(a["kl"] for a in reference["aggregates"] if a["method"] == "full_reuse")
    print("| kv_codec | bytes/token (entries) | questions | method | r | mean KL | norm KL | norm KL vs float32 FR |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in runs:
        store = run["run"].get("store", {})
        for row in run["aggregates"]:
            if row["method"] == "full_attention":
                continue
            fixed = "-" if not fr_kl else f"{1 - row['kl'] / fr_kl:.3f}"
            norm = "-" if row["norm_kl"] is None else f"{row['norm_kl']:.3f}"
            ratio = "-" if row["ratio"] is None else row["ratio"]
            print(f"| {run['config'].get('kv_codec')} | {store.get('entry_bytes_per_token')} | {row['questions']} | "
                  f"{row['method']} | {ratio} | {row['kl']:.4f} | {norm} | {fixed} |")


if __name__ == "__main__":
    main(sys.argv[1:])
