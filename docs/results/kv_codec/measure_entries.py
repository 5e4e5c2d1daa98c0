"""Bytes per token and reconstruction error of every kv_codec on real entries of a float32 store.

    python docs/results/kv_codec/measure_entries.py STORE_FOLDER [QUANTIZED_STORE_FOLDER ...]

Opens STORE_FOLDER read-only (a `fusionrag bench quality --kv-codec float32` store; it may still be
written by the run), packs each plain and fused entry with every codec as a store of that codec
would, and prints per codec: bytes per token held in memory (tensors and scales) and in the disk
frame, and the relative error ||x' - x|| / ||x|| of keys and values (x' expanded back to float32).
Each further folder is opened read-only too and its own entries' bytes per token are printed (the
footprint the benchmark records), to check the packed sizes against a store that wrote them.
"""

from __future__ import annotations

import json
import sys

import torch

from fusionrag_llm.eval.kv_footprint import footprint
from fusionrag_llm.storage import CODECS, RawCodec, StoreOptions, TieredStore, kv_tensors

CODEC_STORES = {"float32": (None, "raw"), "bf16": (torch.bfloat16, "raw"), "fp16": (torch.float16, "raw"),
                "int8": (None, "int8"), "fp8": (None, "fp8"), "int4": (None, "int4.2"),
                "int4 (first layout, values per 32)": (None, "int4")}  # fmt: skip


def _open(folder: str) -> TieredStore:
    return TieredStore(folder, options=StoreOptions(read_only=True, codec=_codec_of(folder)))


def _codec_of(folder: str) -> str:
    for name, codec in (("int4", "int4.2"), ("int4_v32", "int4"), ("int8", "int8"), ("fp8", "fp8")):
        if folder.rstrip("/").endswith(name):
            return codec
    return "raw"


def measure(folder: str) -> dict:
    totals = {name: {"tokens": 0, "memory": 0, "frame": 0, "key_err": 0.0, "value_err": 0.0, "key_norm": 0.0,
                     "value_norm": 0.0} for name in CODEC_STORES}  # fmt: skip
    entries = 0
    with _open(folder) as store:
        for key in store.keys():
            found = store.get(key, copy=False)
            if found is None or found[0].meta.get("variant") not in ("plain", "fused"):
                continue
            entry, entries = found[0], entries + 1
            for name, (dtype, codec_id) in CODEC_STORES.items():
                codec = CODECS.get(codec_id) if codec_id != "raw" else RawCodec(dtype)
                packed = codec.compress(entry) if codec_id != "raw" else entry.copy_to(dtype=dtype or entry.dtype)
                keys, values = kv_tensors(packed, "cpu", torch.float32)
                t = totals[name]
                t["tokens"] += entry.num_tokens
                t["memory"] += packed.nbytes
                t["frame"] += len(codec.encode(packed, key=key))
                t["key_err"] += float((keys - entry.keys).float().pow(2).sum())
                t["value_err"] += float((values - entry.values).float().pow(2).sum())
                t["key_norm"] += float(entry.keys.float().pow(2).sum())
                t["value_norm"] += float(entry.values.float().pow(2).sum())
    rows = {}
    for name, t in totals.items():
        if not t["tokens"]:
            continue
        rows[name] = {"bytes_per_token_memory": round(t["memory"] / t["tokens"], 1),
                      "bytes_per_token_frame": round(t["frame"] / t["tokens"], 1),
                      "key_rel_err": (t["key_err"] / t["key_norm"]) ** 0.5,
                      "value_rel_err": (t["value_err"] / t["value_norm"]) ** 0.5}  # fmt: skip
    return {"store": folder, "entries": entries, "tokens": totals["float32"]["tokens"], "codecs": rows}


def main() -> None:
    result = measure(sys.argv[1])
    result["stores"] = []
    for folder in sys.argv[2:]:
        with _open(folder) as store:
            result["stores"].append({"folder": folder, **footprint(store)})
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
