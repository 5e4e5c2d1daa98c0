"""The GPU benchmark: TTFT of Full Attention, Full Reuse and ``fusionrag`` on a random-weight model with
a real model's shape (weights' values do not change speed, and nothing is downloaded), with a
request's stored KV placed whole before the prefill or layer by layer during it (Cache-Craft's
layer-wise preloading, ``fusion/layer_feed.py``):

    fusionrag bench gpu --model llama3-8b --lengths 8192,16384,32768 --out results/
    fusionrag bench gpu --model small --device cpu --dtype float32 --lengths 1024 --tiers host  # smoke run

Per tier the chunk entries live in (``host``: pinned host memory, every read copies them to the GPU;
``device``: GPU memory, placing is a device copy and rotary), per context length and method, the
request runs alternately with ``layerwise_load`` off and on (``--repeats`` each, after a warm-up),
timed on the host with the device synchronised (one new token, so TTFT plus one sampling step). The
table gives the medians and their ratio; ``gpu.json`` keeps every run (written after each
context, so a run cut short keeps what it measured) and ``gpu.md`` the table.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import torch

from fusionrag_llm.api import FusionRAG
from fusionrag_llm.eval.results import markdown_table, ms, write_json
from fusionrag_llm.kernels.dispatch import resolve_backend
from fusionrag_llm.models.config import config_from_hf
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.models.loader import LoadedModel
from fusionrag_llm.models.tiny import byte_tokenizer, tiny_hf_config
from fusionrag_llm.models.tokenizer import ChatTokenizer
from fusionrag_llm.request import RAGRequest
from fusionrag_llm.storage import StoreBudgets, TieredStore

GiB = 1 << 30
SHAPES = {
    "llama3-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                                num_key_value_heads=8, head_dim=128, rope_theta=500000.0, max_position_embeddings=131072)),
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                                 num_key_value_heads=4, head_dim=128, rope_theta=1e6, max_position_embeddings=131072,
                                 attention_bias=True)),
    "small": ("llama", dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=64, max_position_embeddings=65536)),
}  # fmt: skip
METHODS = (("full_reuse", 0.0), ("fusionrag", 0.15))
DTYPES = ("bfloat16", "float16", "float32")
TOKENS_PER_CHUNK = 512


def random_model(shape: str, device: str, dtype: torch.dtype, seed: int = 0, kernels: str = "auto") -> LoadedModel:
    """A model of ``shape`` with random weights made on ``device`` (the byte tokenizer: 1 token per byte),
    on the attention backend ``kernels`` names ("auto": Triton on CUDA, as a loaded model gets)."""
    family, overrides = SHAPES[shape]
    hf_config = tiny_hf_config(family, **overrides)
    cfg = config_from_hf(hf_config, f"random-{shape}")
    with torch.device("meta"):
        model = DecoderLM(cfg)
    model = model.to_empty(device=device).to(dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, param.shape[-1] ** -0.5, generator=generator)
    model.rotary.inv_freq = model.rotary.inv_freq.to(device)
    model.kernels = resolve_backend(torch.empty(0, device=device), kernels)
    tokenizer = ChatTokenizer(byte_tokenizer(), cfg.eos_token_ids)
    return LoadedModel(f"random-{shape}", model.eval(), tokenizer, hf_config, "built-in")


def chunk_texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(500)]
    texts = []
    for index in range(count):
        text = f"Passage {index}:"
        while len(text) < TOKENS_PER_CHUNK:
            text += " " + rng.choice(words)
        texts.append(text[:TOKENS_PER_CHUNK])
    return texts


def engine_on(loaded: LoadedModel, tier: str, texts: list[str]) -> FusionRAG:
    budgets = StoreBudgets(device_bytes=0, host_bytes=256 * GiB) if tier == "host" else \
        StoreBudgets(device_bytes=256 * GiB, host_bytes=0)  # fmt: skip
    store = TieredStore(None, budgets, loaded.model.device)
    rag = FusionRAG(loaded, store=store, options={"prefix_cache": False, "layerwise_load": False})
    g = torch.Generator().manual_seed(1)
    rag.add_chunks(texts, embeddings=torch.randn(len(texts), 16, generator=g).tolist(), neighbors=2)
    return rag


def timed(rag: FusionRAG, request: RAGRequest, method: str, ratio: float, layerwise: bool) -> dict:
    rag.engine.layerwise_load = layerwise
    sync = torch.cuda.synchronize if rag.engine.model.device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    out = rag.generate(request, method=method, recompute_ratio=ratio, max_new_tokens=1)
    sync()
    stats = out.stats
    return {"s": time.perf_counter() - started, "load_s": stats.load_s, "select_s": stats.select_s,
            "prefill_s": stats.prefill_s, "reused": stats.reused_tokens, "computed": stats.computed_tokens,
            "tiers": dict(stats.tier_hits)}  # fmt: skip


def measure(rag: FusionRAG, texts: list[str], tier: str, context: int, repeats: int) -> list[dict]:
    request = RAGRequest(chunks=texts[: max(1, context // TOKENS_PER_CHUNK)], question="Which passage names the river?")
    rows = []
    for method, ratio in METHODS:
        runs = {False: [], True: []}
        for layerwise in (False, True):  # warm-up
            timed(rag, request, method, ratio, layerwise)
        for _ in range(repeats):
            for layerwise in (False, True):
                runs[layerwise].append(timed(rag, request, method, ratio, layerwise))
        whole = statistics.median(r["s"] for r in runs[False])
        layer = statistics.median(r["s"] for r in runs[True])
        rows.append({"tier": tier, "context": context, "method": method, "ratio": ratio, "whole_s": whole,
                     "layerwise_s": layer, "speedup": whole / layer, "runs": {"whole": runs[False], "layerwise": runs[True]}})  # fmt: skip
    timed(rag, request, "full_attention", 1.0, False)  # warm-up for the FA reference
    fa = statistics.median(timed(rag, request, "full_attention", 1.0, False)["s"] for _ in range(max(1, repeats // 2)))
    for row in rows:
        row["full_attention_s"] = fa
    return rows


def table(rows: list[dict]) -> str:
    headers = ["tier", "context", "method", "FA", "whole", "layer-wise", "whole / layer-wise", "FA / layer-wise"]
    cells = [[r["tier"], r["context"], f"{r['method']} r={r['ratio']}", f"{ms(r['full_attention_s'])} ms",
              f"{ms(r['whole_s'])} ms", f"{ms(r['layerwise_s'])} ms", f"{r['speedup']:.2f}x",
              f"{r['full_attention_s'] / r['layerwise_s']:.1f}x"] for r in rows]  # fmt: skip
    return markdown_table(headers, cells)


def run_gpu_bench(shape: str, device: str, dtype: str, contexts: list[int], tiers: list[str], repeats: int,
                      out: Path, kernels: str = "auto") -> dict:  # fmt: skip
    """Measure every (tier, context, method); writes ``gpu.json`` and ``gpu.md`` into ``out``."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if "device" in tiers and not device.startswith("cuda"):
        raise ValueError("the device tier needs a CUDA device (--device cuda); on the CPU measure --tiers host")
    if min(contexts) < TOKENS_PER_CHUNK:
        raise ValueError(f"lengths must be at least one chunk ({TOKENS_PER_CHUNK} tokens), got {min(contexts)}")
    loaded = random_model(shape, device, getattr(torch, dtype), kernels=kernels)
    texts = chunk_texts(max(contexts) // TOKENS_PER_CHUNK)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    result = {"device": name, "shape": shape, "dtype": dtype, "kernels": loaded.model.kernels,
              "tokens_per_chunk": TOKENS_PER_CHUNK, "rows": []}
    for tier in tiers:
        rag = engine_on(loaded, tier, texts)
        for context in contexts:
            result["rows"] += measure(rag, texts, tier, context, repeats)
            write_json(out / "gpu.json", result)
        rag.store.close()
    heading = f"{name}, {shape} (random weights), {dtype}, {loaded.model.kernels} attention; TTFT + 1 token, median of {repeats}"
    (out / "gpu.md").write_text(f"{heading}\n\n{table(result['rows'])}\n")
    return result
