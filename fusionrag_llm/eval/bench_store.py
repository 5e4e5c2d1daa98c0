"""Store benchmark: loading a context's entries from each tier vs computing them, end-to-end TTFT
with entries on disk vs in memory, and how much loading the asynchronous scheduler hides. With a
remote URL, also the load time per entry from each tier: host, disk, and the Redis tier.

One run, one engine: every ratio reported is between numbers measured here, now.
"""

from __future__ import annotations

import logging
import platform
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.eval.datasets import QAExample
from fusionrag_llm.storage import StoreBudgets, StoreOptions, TieredStore

logger = logging.getLogger(__name__)


@dataclass
class StoreBenchConfig:
    model: str = "smollm2-135m"
    ratio: float = 0.15
    neighbors: int = 4
    requests: int = 4  # distinct requests for the overlap measurement
    max_new_tokens: int = 1
    remote: str | None = None  # a Redis URL: also time loads from the remote tier
    rounds: int = 5  # per-entry load times: median over this many fresh store objects


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _request(example: QAExample) -> RAGRequest:
    return RAGRequest(chunks=[p.text for p in example.passages], question=example.question)


def tier_load_times(rag: FusionRAG, folder: Path, example: QAExample) -> dict:
    """Seconds to get one request's fused entries from disk (fresh store), then from host memory,
    against computing the same chunks' plain entries from scratch."""
    token_ids = [rag.parts.catalog.get(p.text).token_ids for p in example.passages]
    keys = [rag.parts.entries.key(ids, "fused") for ids in token_ids]
    fresh = type(rag)(rag.parts.loaded, store=folder)  # entries only on disk in this view
    disk_s, found = _timed(lambda: [fresh.store.get(k, copy=False) for k in keys])
    assert all(f is not None and f[1] == "disk" for f in found), "expected every entry on disk"
    host_s, found = _timed(lambda: [fresh.store.get(k, copy=False) for k in keys])
    compute_s, _ = _timed(lambda: rag.parts.entries.compute_plain(token_ids))
    tokens = sum(map(len, token_ids))
    fresh.store.close()
    return {"context_tokens": tokens, "disk_s": disk_s, "host_s": host_s, "compute_s": compute_s,
            "device_s": None, "tiers_seen_second": sorted({f[1] for f in found})}  # fmt: skip


def _mean_get_s(store: TieredStore, keys: list[str], tier: str) -> float:
    """Mean seconds of one `get` over `keys`, each of which must come from `tier`."""
    seconds, found = _timed(lambda: [store.get(k, copy=False) for k in keys])
    seen = sorted({f[1] if f is not None else "miss" for f in found})
    if seen != [tier]:
        raise RuntimeError(f"expected every entry from the {tier} tier, got {seen}")
    return seconds / len(keys)


def per_entry_load_times(folder: Path, keys: list[str], remote: str, rounds: int) -> dict:
    """Median over `rounds` fresh store objects of the mean seconds to load one entry from the disk
    (a store over `folder` alone), the remote tier (a store of host memory and the remote alone) and
    then host memory. The entries are copied to the remote first when it lacks them."""
    memory_budgets = StoreBudgets(device_bytes=0, disk_bytes=2**40, remote_bytes=2**40)
    remote_options = StoreOptions(remote_url=remote)
    with TieredStore(folder, memory_budgets) as disk, TieredStore(None, memory_budgets, options=remote_options) as shared:
        entry_bytes = [disk.get(k, copy=False)[0].nbytes for k in keys]
        for key in keys:
            if key not in shared and not shared.put(key, disk.get(key, copy=False)[0]):
                raise RuntimeError(f"could not copy entry {key} to the remote tier at {remote}")
    times: dict[str, list[float]] = {"disk": [], "remote": [], "host": []}
    for _ in range(rounds):
        with TieredStore(folder, memory_budgets) as disk:
            times["disk"].append(_mean_get_s(disk, keys, "disk"))
        with TieredStore(None, memory_budgets, options=remote_options) as shared:
            times["remote"].append(_mean_get_s(shared, keys, "remote"))
            times["host"].append(_mean_get_s(shared, keys, "host"))
    median = {tier: statistics.median(values) for tier, values in times.items()}
    return {"entries": len(keys), "mean_entry_bytes": sum(entry_bytes) / len(keys), "rounds": rounds,
            "seconds_per_entry": median, "remote_vs_disk": median["remote"] / median["disk"]}  # fmt: skip


def ttft_disk_vs_memory(rag: FusionRAG, folder: Path, example: QAExample, cfg: StoreBenchConfig) -> dict:
    request = _request(example)
    full = rag.generate(request, method="full_attention", max_new_tokens=cfg.max_new_tokens)
    fresh = type(rag)(rag.parts.loaded, store=folder, prefix_cache=False)
    on_disk = fresh.generate(request, method="fusionrag", recompute_ratio=cfg.ratio, max_new_tokens=cfg.max_new_tokens)
    in_memory = fresh.generate(request, method="fusionrag", recompute_ratio=cfg.ratio, max_new_tokens=cfg.max_new_tokens)
    fresh.store.close()
    return {
        "prompt_tokens": full.stats.prompt_tokens,
        "full_attention_ttft_s": full.stats.ttft_s,
        "fusionrag_disk": on_disk.stats.to_dict(),
        "fusionrag_memory": in_memory.stats.to_dict(),
        "speedup_disk_vs_full": full.stats.ttft_s / on_disk.stats.ttft_s,
        "speedup_memory_vs_full": full.stats.ttft_s / in_memory.stats.ttft_s,
    }


def overlap(rag: FusionRAG, folder: Path, examples: list[QAExample], cfg: StoreBenchConfig) -> dict:
    """The same distinct requests one by one (loads inline) and through generate_many (prefetched)."""
    requests = [_request(e) for e in examples]
    knobs = dict(method="fusionrag", recompute_ratio=cfg.ratio, max_new_tokens=cfg.max_new_tokens)
    inline = type(rag)(rag.parts.loaded, store=folder, prefix_cache=False)
    inline_s, singles = _timed(lambda: [inline.generate(r, **knobs) for r in requests])
    inline.store.close()
    queued = type(rag)(rag.parts.loaded, store=folder, prefix_cache=False)
    queued_s, batch = _timed(lambda: queued.generate_many(requests, **knobs))
    queued.store.close()
    prefetch = sum(g.stats.prefetch_s for g in batch)
    wait = sum(g.stats.wait_s for g in batch)
    return {
        "requests": len(requests),
        "one_by_one_s": inline_s,
        "one_by_one_load_s": sum(g.stats.load_s for g in singles),
        "generate_many_s": queued_s,
        "generate_many_load_s": sum(g.stats.load_s for g in batch),
        "prefetch_s": prefetch,
        "wait_s": wait,
        "hidden_load_s": prefetch - wait,
        "same_answers": [g.token_ids for g in batch] == [g.token_ids for g in singles],
    }


def run_store_benchmark(examples: list[QAExample], cfg: StoreBenchConfig, folder: Path | None = None) -> dict:
    """All three measurements on ``examples`` (the first one for the single-request numbers)."""
    folder = Path(folder or tempfile.mkdtemp(prefix="fusionrag-store-bench-"))
    # the compute dtype, as every recorded run of this benchmark (a new folder's default is bf16)
    rag = FusionRAG.from_pretrained(cfg.model, store=folder, prefix_cache=False, kv_codec="model")
    texts = list(dict.fromkeys(p.text for e in examples for p in e.passages))
    ingest_s, _ = _timed(lambda: rag.add_chunks(texts, neighbors=cfg.neighbors, progress=True))
    first, rest = examples[0], examples[1 : 1 + cfg.requests]
    result = {
        "config": asdict(cfg),
        "machine": {"platform": platform.platform(), "cpus": torch.get_num_threads(), "torch": torch.__version__,
                    "device": str(rag.parts.loaded.model.device)},  # fmt: skip
        "ingest_s": ingest_s,
        "chunks": len(texts),
        "tier_load": tier_load_times(rag, folder, first),
        "ttft": ttft_disk_vs_memory(rag, folder, first, cfg),
        "overlap": overlap(rag, folder, rest or [first], cfg),
    }
    if cfg.remote is not None:
        keys = [rag.parts.entries.key(rag.parts.catalog.get(p.text).token_ids, "fused") for p in first.passages]
        result["per_entry_load"] = per_entry_load_times(folder, keys, cfg.remote, cfg.rounds)
    rag.store.close()
    return result


def store_markdown(result: dict) -> str:
    load, ttft, lap = result["tier_load"], result["ttft"], result["overlap"]
    disk, memory = ttft["fusionrag_disk"], ttft["fusionrag_memory"]
    return "\n".join([
        f"Context of {load['context_tokens']} chunk tokens ({result['chunks']} chunks ingested in {result['ingest_s']:.1f} s)",
        "",
        "| source of the context's KV | seconds | vs computing |",
        "| --- | ---: | ---: |",
        f"| compute (plain prefill of the chunks) | {load['compute_s']:.3f} | 1.0x |",
        f"| disk tier (fresh store, OS page cache) | {load['disk_s']:.3f} | {load['compute_s'] / load['disk_s']:.1f}x faster |",
        f"| host tier | {load['host_s']:.4f} | {load['compute_s'] / load['host_s']:.0f}x faster |",
        "| device tier | n/a on CPU | |",
        "",
        f"| TTFT, {ttft['prompt_tokens']}-token prompt | seconds | load | select | prefill | speedup vs full attention |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| full_attention | {ttft['full_attention_ttft_s']:.2f} | | | | 1.0x |",
        f"| fusionrag r={result['config']['ratio']}, entries on disk | {disk['ttft_s']:.2f} | {disk['load_s']:.2f} | "
        f"{disk['select_s']:.2f} | {disk['prefill_s']:.2f} | {ttft['speedup_disk_vs_full']:.1f}x |",
        f"| fusionrag r={result['config']['ratio']}, entries in memory | {memory['ttft_s']:.2f} | {memory['load_s']:.2f} | "
        f"{memory['select_s']:.2f} | {memory['prefill_s']:.2f} | {ttft['speedup_memory_vs_full']:.1f}x |",
        "",
        f"| {lap['requests']} distinct requests, entries on disk | wall s | load inside requests (s) |",
        "| --- | ---: | ---: |",
        f"| one by one (loads inline) | {lap['one_by_one_s']:.2f} | {lap['one_by_one_load_s']:.2f} |",
        f"| generate_many (prefetch thread) | {lap['generate_many_s']:.2f} | {lap['generate_many_load_s']:.2f} |",
        "",
        f"Prefetch thread loaded for {lap['prefetch_s']:.2f} s; the scheduler waited {lap['wait_s']:.2f} s of it, "
        f"so {lap['hidden_load_s']:.2f} s of loading was hidden behind compute. Same answers: {lap['same_answers']}.",
        *per_entry_markdown(result.get("per_entry_load")),
    ])  # fmt: skip


def per_entry_markdown(load: dict | None) -> list[str]:
    if load is None:
        return []
    per = load["seconds_per_entry"]
    return [
        "",
        f"| load of one entry ({load['mean_entry_bytes'] / 2**20:.2f} MiB on average; median of {load['rounds']} "
        f"rounds of {load['entries']} entries) | ms per entry | vs disk |",
        "| --- | ---: | ---: |",
        *[f"| {name} | {per[tier] * 1000:.3f} | {per[tier] / per['disk']:.2g}x |"
          for tier, name in (("host", "host tier"), ("disk", "disk tier (OS page cache)"),
                             ("remote", "remote tier (Redis over loopback)"))],
    ]  # fmt: skip
