"""How many bytes a store spends per token of chunk KV, measured from its entries.

Each plain and fused entry the store holds counts with its in-memory size (keys, values and a
quantized codec's scales: what a memory tier holds) and the size of its frame (the bytes written
to the disk tier: that plus header and checksum, as the store's codec encodes it), over its tokens.

Example:
    >>> import torch
    >>> from fusionrag_llm.storage import KVEntry, TieredStore
    >>> store = TieredStore(None)
    >>> kv = torch.zeros(2, 1, 4, 8)
    >>> _ = store.put("a" * 64, KVEntry((1, 2, 3, 4), kv, kv.clone(), {"variant": "plain"}))
    >>> footprint(store)["entry_bytes_per_token"]
    128.0
"""

from __future__ import annotations

from fusionrag_llm.storage import CODECS, TieredStore

CHUNK_VARIANTS = ("plain", "fused")


def footprint(store: TieredStore) -> dict:
    """Entries, tokens and bytes per token of the store's chunk entries (path blocks left out)."""
    codec = CODECS.get(store.codec_id)
    entries = tokens = entry_bytes = frame_bytes = 0
    for key in store.keys():
        found = store.get(key, copy=False)
        if found is None or found[0].meta.get("variant") not in CHUNK_VARIANTS:
            continue
        entry = found[0]
        entries += 1
        tokens += entry.num_tokens
        entry_bytes += entry.nbytes
        frame_bytes += len(codec.encode(entry, key=key))
    per = (lambda total: round(total / tokens, 1)) if tokens else (lambda total: None)
    return {"codec": store.codec_id, "storage_dtype": _dtype_name(store.storage_dtype),
            "entries": entries, "tokens": tokens, "entry_bytes_per_token": per(entry_bytes),
            "frame_bytes_per_token": per(frame_bytes)}  # fmt: skip


def _dtype_name(dtype) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")
