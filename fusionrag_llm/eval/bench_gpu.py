"""The GPU benchmark: every GPU figure in one run, each against its target, on a random-weight model with
a real model's shape (weights' values do not change speed, and nothing is downloaded):

    fusionrag bench gpu --out results/     # llama3-8b in bf16, within about 6 minutes on one H100
    fusionrag bench gpu --model small --device cpu --dtype float32 --lengths 1024 --max-new-tokens 4 \\
        --concurrency 2 --repeats 1        # smoke run

The sections (SECTIONS, run in that order; what each measures: docs/BENCHMARKS.md#gpu) write into
``gpu.json`` as each ends, so a run cut short keeps what it measured; ``gpu.md`` and the printout hold
one table of every figure. ``all`` is every section but ``layerwise``, with ``tests`` only on CUDA. A
time budget thins the repeats above 16k tokens and skips a section that would start past it. A section
that raises fails alone: its error and traceback go into ``gpu.json``, a "failed" row into the table,
its engines are dropped, and the next section runs.
"""

from __future__ import annotations

import gc
import logging
import random
import statistics
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from fusionrag_llm.api import FusionRAG
from fusionrag_llm.eval.gpu_checks import (attention_rows, decode_attention_rows, header, prefill_attention_rows,
                                           run_gpu_tests, tests_folder)
from fusionrag_llm.eval.results import markdown_table, ms, write_json
from fusionrag_llm.kernels.dispatch import resolve_backend
from fusionrag_llm.models.attention_backend import TritonAttention
from fusionrag_llm.models.config import config_from_hf
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.models.loader import LoadedModel
from fusionrag_llm.models.tiny import byte_tokenizer, tiny_hf_config
from fusionrag_llm.models.tokenizer import ChatTokenizer
from fusionrag_llm.engine.sampling import SamplingParams
from fusionrag_llm.methods import make_plan
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
SECTIONS = ("add_chunks", "decode", "ttft", "e2e", "attention", "profile", "layerwise", "tests")  # in run order
PROFILED_STEPS = 32  # decode steps of the profile section, after a prefill of DECODE_CONTEXTS[0] tokens
TOP_OPS = 12  # operations listed per profile, by their own time
TOKENS_PER_CHUNK = 512
DECODE_CONTEXTS = (1024, 8192)
QUESTION = "Which passage names the river?"
TESTS_RESERVE_S = 120.0  # of the time budget, for the tests
ADD_CHUNKS_BEFORE_S = 12.7  # 32 chunks on an H200, 2026-11-27
log = logging.getLogger(__name__)
TARGETS = {  # figure key -> (least value, as the table says it)
    "decode_1": (150, ">= 150 tok/s"), "decode_32": (3000, ">= 3000 tok/s"),
    "ttft_fusionrag_16384": (4, ">= 4x"), "ttft_fusionrag_32768": (5, ">= 5x"), "ttft_full_reuse_32768": (30, ">= 30x"),
    "e2e_32768": (3, ">= 3x"), "add_chunks": (5, f">= 5x faster than {ADD_CHUNKS_BEFORE_S} s"),
    "tests": (1, "all pass"),
}  # fmt: skip


@dataclass
class GPUBenchConfig:
    """What ``run_gpu_bench`` measures: ``sections`` of SECTIONS or "all" (see the module docstring); the
    tests run from ``tests_dir`` (default: the checkout's ``tests`` folder). ``budget_s``: the whole run's;
    a section that would start past it (less TESTS_RESERVE_S when the tests run) is skipped."""

    shape: str = "llama3-8b"
    device: str = "cuda"
    dtype: str = "bfloat16"
    contexts: tuple[int, ...] = (8192, 16384, 32768)
    repeats: int = 5
    sections: tuple[str, ...] = ("all",)
    new_tokens: int = 128
    batches: tuple[int, ...] = (8, 32)
    add_chunks: int = 32
    kernels: str | None = None
    tests_dir: Path | None = None
    budget_s: float = 360.0

    def __post_init__(self) -> None:
        cuda = self.device.startswith("cuda")
        every = {*SECTIONS[:6], *(("tests",) if cuda else ())} if "all" in self.sections else set()
        if unknown := set(self.sections) - {"all", *SECTIONS}:
            raise ValueError(f"unknown sections {','.join(sorted(unknown))}; all or some of {', '.join(SECTIONS)}")
        self.sections = tuple(name for name in SECTIONS if name in every or name in self.sections)
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; choose one of {', '.join(SHAPES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if cuda and not torch.cuda.is_available():
            raise ValueError("no CUDA device here; a smoke run on the CPU: --model small --device cpu --dtype float32")
        if not self.contexts or min(self.contexts) < TOKENS_PER_CHUNK:
            raise ValueError(f"lengths must be at least one chunk ({TOKENS_PER_CHUNK} tokens), got {self.contexts}")
        if min(self.repeats, self.new_tokens, self.add_chunks, *self.batches) < 1:
            raise ValueError("repeats, new tokens, add_chunks and batch sizes must be >= 1")


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
    if model.device.type == "cuda":  # as a loaded model gets
        model.fuse_projections()
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


def engine_on(loaded: LoadedModel, tier: str) -> FusionRAG:
    budgets = StoreBudgets(device_bytes=0, host_bytes=256 * GiB) if tier == "host" else \
        StoreBudgets(device_bytes=256 * GiB, host_bytes=0)  # fmt: skip
    store = TieredStore(None, budgets, loaded.model.device)
    return FusionRAG(loaded, store=store, options={"reproducible": True, "layerwise_load": False})


def add_timed(rag: FusionRAG, texts: list[str], seed: int = 1) -> float:
    """Seconds to store plain and fused entries of ``texts`` (2 neighbours, random embeddings)."""
    embeddings = torch.randn(len(texts), 16, generator=torch.Generator().manual_seed(seed)).tolist()
    sync = _sync(rag.engine.model.device)
    started = time.perf_counter()
    rag.add_chunks(texts, embeddings=embeddings, neighbors=2)
    sync()
    return time.perf_counter() - started


def _sync(device: torch.device):
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def timed(rag: FusionRAG, requests: list[RAGRequest], method: str, ratio: float | None, new_tokens: int = 1,
          layerwise: bool = False) -> dict:  # fmt: skip
    """One request through ``generate`` (with its TTFT's parts) or several through ``generate_many``, every
    answer ``new_tokens`` long: wall seconds, the time to the last first token, decode tokens/s after it."""
    rag.engine.kv.layerwise = layerwise
    sync, sampling = _sync(rag.engine.model.device), {"ignore_eos": True}
    sync()
    started = time.perf_counter()
    if len(requests) == 1:
        outs = [rag.generate(requests[0], method, ratio, new_tokens, sampling=sampling)]
    else:
        outs = rag.generate_many(requests, method, ratio, new_tokens, sampling=sampling)
    sync()
    total, stats = time.perf_counter() - started, outs[0].stats
    decoding = _decoding(outs, total)
    return {"s": total, **decoding, "requests": len(outs), "tok_s": decoding["tokens"] / total, "load_s": stats.load_s,
            "select_s": stats.select_s, "prefill_s": stats.prefill_s, "reused": stats.reused_tokens,
            "computed": stats.computed_tokens, "tiers": dict(stats.tier_hits)}  # fmt: skip


def shrinking_batch(rag: FusionRAG, requests: list[RAGRequest], new_tokens: int) -> dict:
    """The requests at once through the step API, request i answering ``new_tokens * (i + 1) // n`` tokens:
    after the shortest ends, the batch loses a sequence every few steps, as a server's does when its
    requests end (a captured decode graph serves a size, ``models/decode_graphs.py``). Decode tokens/s
    in all after the last first token, and how many decode graphs the model keeps at the end (and the memory
    pools they were captured into: one)."""
    engine, plan, n = rag.engine, make_plan("fusionrag", None), len(requests)
    lengths = [max(1, new_tokens * (i + 1) // n) for i in range(n)]
    sync, sampling = _sync(engine.model.device), SamplingParams(ignore_eos=True)
    for warm in (True, False):
        sync()
        started = time.perf_counter()
        seqs = [engine.add_request(rag.segments(request), plan, min(8, length) if warm else length, sampling=sampling)
                for request, length in zip(requests, lengths)]  # fmt: skip
        engine.run_until_finished(seqs)
        sync()
    total = time.perf_counter() - started
    graphs = engine.model.decode_graphs
    return {"requests": n, "shortest": lengths[0], "s": total, **_decoding(seqs, total), "graphs": graphs.captured,
            "graph_memory_pools": graphs.memory_pools}  # fmt: skip


def _decoding(answers, total: float) -> dict:
    """Of answers (generations or step-API sequences) that took ``total`` seconds in all: the time to the
    last first token, the tokens, and the decode tokens/s after that first token."""
    first = max(answer.stats.queue_s + answer.stats.ttft_s for answer in answers)
    decoded = sum(len(answer.token_ids) - 1 for answer in answers)
    return {"ttft_s": first, "tokens": decoded + len(answers), "decode_tok_s": decoded / max(total - first, 1e-9)}


def measure(rag: FusionRAG, request: RAGRequest, context: int, repeats: int, layerwise: bool = False) -> list[dict]:
    """TTFT (+ one sampling step) per method, with entries placed whole (and, ``layerwise``, layer by layer)."""
    modes = {"whole": False, "layerwise": True} if layerwise else {"whole": False}
    rows = []
    for method, ratio in METHODS:
        for layerwise in modes.values():  # warm-up
            timed(rag, [request], method, ratio, layerwise=layerwise)
        runs = {name: [] for name in modes}
        for _ in range(repeats):
            for name, layerwise in modes.items():
                runs[name].append(timed(rag, [request], method, ratio, layerwise=layerwise))
        medians = {f"{name}_s": statistics.median(r["s"] for r in runs[name]) for name in modes}
        rows.append({"context": context, "method": method, "ratio": ratio, "layerwise_s": None, **medians,
                     "runs": runs})  # fmt: skip
    if layerwise:
        return rows
    timed(rag, [request], "full_attention", 1.0)  # warm-up for the FA reference
    fa = statistics.median(timed(rag, [request], "full_attention", 1.0)["s"] for _ in range(max(1, repeats // 2)))
    for row in rows:
        row.update(full_attention_s=fa, vs_full_attention=fa / row["whole_s"])
    return rows


class _Run:
    """One run's model, engines (one per store tier, made when a section first needs it) and results; a
    method per section returns that section's results and adds its rows to the summary (``figure``)."""

    def __init__(self, config: GPUBenchConfig) -> None:
        c = self.config = config
        self.deadline = time.perf_counter() + c.budget_s
        self.loaded = random_model(c.shape, c.device, getattr(torch, c.dtype), kernels=c.kernels)
        self.tier = "device" if c.device.startswith("cuda") else "host"  # where the entries live
        self.texts = chunk_texts(max(c.contexts) // TOKENS_PER_CHUNK)
        self.engines: dict[str, FusionRAG] = {}
        config = asdict(c) | {"tests_dir": c.tests_dir and str(c.tests_dir)}
        self.result = {"header": header(c.device), "config": config, "kernels": self.loaded.model.kernels,
                       "figures": [], "section_s": {}}  # fmt: skip

    def release(self, keep_model: bool = False) -> None:
        """Close the engines and drop the model (the tests' own models need the device memory); with
        ``keep_model``, the engines only (after a failed section: the next one starts from new engines)."""
        for rag in self.engines.values():
            rag.store.close()
        self.engines = {}
        if not keep_model:
            self.loaded = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def engine(self, tier: str) -> FusionRAG:
        if tier not in self.engines:
            rag = self.engines[tier] = engine_on(self.loaded, tier)
            scheduler = rag.engine.scheduler  # "N requests at once" decodes all N together
            most = max(scheduler.limit("max_num_seqs"), *self.config.batches)
            scheduler.config = replace(scheduler.config, max_num_seqs=most)
            # the cache slots its requests may hold (None: no bound), for reading a memory failure
            self.result.setdefault("kv_slots", {})[tier] = scheduler.limit("max_kv_tokens")
            add_timed(rag, self.texts)
        return self.engines[tier]

    def request(self, context: int, index: int = 0) -> RAGRequest:
        count = max(1, context // TOKENS_PER_CHUNK)
        chunks = [self.texts[(index + i) % len(self.texts)] for i in range(count)]
        return RAGRequest(chunks=chunks, question=QUESTION if index == 0 else f"{QUESTION} ({index})")

    def figure(self, label: str, measured: str, key: str | None = None, value: float | None = None) -> None:
        least, target = TARGETS.get(key, (None, "-"))
        met = "-" if least is None or value is None else ("yes" if value >= least else "no")
        self.result["figures"].append({"figure": label, "measured": measured, "target": target, "met": met, "key": key,
                                       "value": value})  # fmt: skip

    def section(self, name: str) -> dict:
        """Section ``name``'s results; if it raises, the error instead (it fails alone: the run goes on)."""
        try:
            return getattr(self, name)()
        except Exception as error:  # noqa: BLE001 - any failure of one section is reported, not raised
            log.exception("bench gpu: section %s failed", name)
            self.release(keep_model=True)
            message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            self.figure(name, f"failed: {message}")
            return {"raised": message, "traceback": traceback.format_exc()}

    def add_chunks(self) -> dict:
        count = self.config.add_chunks  # new ones, after the engine stored the benchmark's own (its warm-up)
        seconds = add_timed(self.engine(self.tier), chunk_texts(count, seed=3), seed=3)
        self.figure(f"add_chunks, {count} chunks of {TOKENS_PER_CHUNK} tokens, 2 neighbours", f"{seconds:.2f} s "
                    f"({count / seconds:.1f} chunks/s)", "add_chunks", ADD_CHUNKS_BEFORE_S / seconds)  # fmt: skip
        return {"chunks": count, "tokens_per_chunk": TOKENS_PER_CHUNK, "neighbors": 2, "s": seconds,
                "chunks_per_s": count / seconds}  # fmt: skip

    def decode(self) -> dict:
        c, rag = self.config, self.engine(self.tier)
        single = [x for x in DECODE_CONTEXTS if x <= max(c.contexts)] or [min(c.contexts)]
        batch_context = min(DECODE_CONTEXTS[0], max(c.contexts))
        runs = []
        for context, size in [(x, 1) for x in single] + [(batch_context, n) for n in c.batches]:
            requests = [self.request(context, i) for i in range(size)]
            timed(rag, requests, "fusionrag", None, min(8, c.new_tokens))  # warm-up
            runs.append({"context": context, **timed(rag, requests, "fusionrag", None, c.new_tokens)})
            label = "1 sequence" if size == 1 else f"{size} requests at once, in all"
            self.figure(f"decode, {label}, {context} context", f"{runs[-1]['decode_tok_s']:.1f} tok/s",
                        f"decode_{size}", runs[-1]["decode_tok_s"])  # fmt: skip
        model, request = rag.engine.model, [self.request(batch_context)]
        model.cuda_graphs = False  # the same step layer by layer: what the captured graphs save
        try:
            eager = {"context": batch_context, **timed(rag, request, "fusionrag", None, c.new_tokens)}
        finally:
            model.cuda_graphs = True
        self.figure(f"decode, 1 sequence, {batch_context} context, decode graphs off",
                    f"{eager['decode_tok_s']:.1f} tok/s")  # fmt: skip
        size = max(c.batches)
        shrinking = shrinking_batch(rag, [self.request(batch_context, i) for i in range(size)], c.new_tokens)
        self.figure(f"decode, {size} requests ending one by one ({shrinking['shortest']}..{c.new_tokens} new tokens), "
                    f"in all, {batch_context} context", f"{shrinking['decode_tok_s']:.1f} tok/s, "
                    f"{shrinking['graphs']} decode graphs")  # fmt: skip
        return {"new_tokens": c.new_tokens, "runs": runs, "eager": eager, "shrinking": shrinking}

    def ttft(self, tier: str | None = None, layerwise: bool = False) -> dict:
        rows = []
        for context in self.config.contexts:
            repeats = max(1, self.config.repeats * 16384 // max(context, 16384))  # fewer at 32k
            rows += measure(self.engine(tier or self.tier), self.request(context), context, repeats, layerwise)
        for r in rows:
            label, whole = f"TTFT {r['method']} r={r['ratio']}", r["whole_s"]
            if layerwise:
                self.figure(f"{label} from host memory, whole vs layer by layer, {r['context']}",
                            f"{whole / r['layerwise_s']:.2f}x ({ms(whole)} vs {ms(r['layerwise_s'])} ms)")  # fmt: skip
            else:
                self.figure(f"{label} vs full_attention, {r['context']}", f"{r['vs_full_attention']:.1f}x ({ms(whole)} "
                            f"vs {ms(r['full_attention_s'])} ms)", f"ttft_{r['method']}_{r['context']}",
                            r["vs_full_attention"])  # fmt: skip
        return {"tier": tier or self.tier, "rows": rows}

    def layerwise(self) -> dict:
        return self.ttft("host", layerwise=True)

    def e2e(self) -> dict:
        c, context = self.config, max(self.config.contexts)
        rag, runs = self.engine(self.tier), {}
        # each method answers a request of its own that nothing answered before (no KV of an earlier
        # run of the same prompt is there to reuse); the warm-up answers another one
        for method, ratio, index in (("fusionrag", 0.15, 7), ("full_attention", 1.0, 9)):
            if "ttft" not in c.sections:  # else warm at this length
                timed(rag, [self.request(context, index + 1)], method, ratio, 2)
            runs[method] = timed(rag, [self.request(context, index)], method, ratio, c.new_tokens)
        fr, fa = runs["fusionrag"]["s"], runs["full_attention"]["s"]
        self.figure(f"end to end (TTFT + {c.new_tokens} tokens) fusionrag r=0.15 vs full_attention, {context}",
                    f"{fa / fr:.2f}x ({fr:.2f} vs {fa:.2f} s)", f"e2e_{context}", fa / fr)  # fmt: skip
        return {"context": context, "new_tokens": c.new_tokens, "runs": runs, "vs_full_attention": fa / fr}

    def attention(self) -> dict:
        rows = attention_rows(self.loaded.model, max(self.config.contexts), self.config.repeats)
        for r in rows:
            flex = f"{r['flex_ms']:.2f} ms (max diff {r['max_abs_diff']:.1e})" if "flex_ms" in r else r["flex"]
            self.figure(f"recompute attention, {r['fraction']:.0%} of {r['keys']} keys", f"own {r['own_ms']:.2f} ms, "
                        f"FlexAttention {flex}, causal SDPA of all keys {r['causal_sdpa_ms']:.2f} ms")  # fmt: skip
        decode = decode_attention_rows(self.loaded.model, max(self.config.contexts), self.config.repeats)
        for r in decode:
            self.figure(f"decode attention, {r['requests']} x {r['keys']} keys, one call",
                        f"keys in {r['splits']} ranges {r['split_ms']:.3f} ms, whole {r['whole_ms']:.3f} ms "
                        f"(max diff {r['max_abs_diff']:.1e})")  # fmt: skip
        prefill = prefill_attention_rows(self.loaded.model, max(self.config.contexts), self.config.repeats)
        for r in prefill:
            self.figure(f"prefill attention, {r['requests']} x {r['tokens']} tokens, causal",
                        f"one request at a time {r['each_ms']:.3f} ms, all in one call {r['one_call_ms']:.3f} ms "
                        f"(max diff {r['max_abs_diff']:.1e})")  # fmt: skip
        return {"rows": rows, "decode": decode, "prefill": prefill, "ttft": self.recompute_ttft()}

    def recompute_ttft(self) -> dict:
        """``fusionrag``'s time to the first token at the longest length with the recompute through each of
        the Triton backend's choices (``TritonAttention.recompute``): the own kernel and FlexAttention."""
        rag, context = self.engine(self.tier), max(self.config.contexts)
        backend = rag.engine.model.attention
        if not isinstance(backend, TritonAttention):
            return {"skipped": f"the {backend.name} backend has one recompute path"}
        request, seconds = self.request(context), {}
        try:
            for recompute in TritonAttention.RECOMPUTE:
                backend.recompute = recompute
                timed(rag, [request], "fusionrag", 0.15)  # warm-up (FlexAttention compiles here)
                seconds[recompute] = statistics.median(timed(rag, [request], "fusionrag", 0.15)["s"]
                                                       for _ in range(max(1, self.config.repeats // 2)))  # fmt: skip
        finally:
            backend.recompute = "kernel"
        self.figure(f"TTFT fusionrag r=0.15, {context}, recompute by the own kernel vs FlexAttention",
                    f"{ms(seconds['kernel'])} vs {ms(seconds['flex'])} ms ({seconds['kernel'] / seconds['flex']:.2f}x)")  # fmt: skip
        return {"context": context, "s": seconds}

    def profile(self) -> dict:
        """Where the time goes (torch profiler): kernel launches and host reads (device syncs) per decode step
        of one sequence, and the operations that take most of the time of ``add_chunks`` (4 chunks) and of
        one ``fusionrag`` request's time to the first token at the longest length."""
        rag, context = self.engine(self.tier), min(DECODE_CONTEXTS[0], max(self.config.contexts))
        engine = rag.engine
        engine.add_request(rag.segments(self.request(context)), make_plan("fusionrag"), PROFILED_STEPS + 4,
                           sampling=SamplingParams(ignore_eos=True))  # fmt: skip
        for _ in range(3):  # its prefill and first token, then a step run eagerly and one captured (CUDA)
            engine.step()
        steps = profiled(lambda: [engine.step() for _ in range(PROFILED_STEPS)], rag.engine.model.device)
        while engine.has_unfinished():
            engine.step()
        per_step = {name: count / PROFILED_STEPS for name, count in steps["counts"].items()}
        self.figure(f"decode step profile (torch profiler, {context} context, {PROFILED_STEPS} steps)",
                    f"{per_step['launches']:.0f} kernel launches, {per_step['graph_launches']:.0f} graph replays, "
                    f"{per_step['device_ops']:.0f} device operations and {per_step['host_reads']:.0f} host reads per step")  # fmt: skip
        ingest = profiled(lambda: add_timed(rag, chunk_texts(4, seed=5), seed=5), rag.engine.model.device)
        self.figure("add_chunks profile (4 chunks): most time in", _top(ingest))
        longest = max(self.config.contexts)  # where each method's time to the first token goes
        request, firsts = self.request(longest), {}
        for method, ratio in (("fusionrag", 0.15), ("full_reuse", None)):
            timed(rag, [request], method, ratio)  # warm at this length
            first = firsts[method] = profiled(lambda: timed(rag, [request], method, ratio), rag.engine.model.device)
            self.figure(f"TTFT {method} profile ({longest})", f"{first['wall_ms']:.0f} ms, device busy "
                        f"{first['device_ms']:.0f} ms, {first['counts']['launches']} kernel launches, "
                        f"{first['counts']['host_reads']} host reads; most time in {_top(first)}")  # fmt: skip
        return {"context": context, "steps": PROFILED_STEPS, "per_step": per_step, "decode_ops": steps["ops"],
                "add_chunks_ops": ingest["ops"], "ttft_context": longest, "ttft": firsts}  # fmt: skip

    def tests(self) -> dict:
        folder = self.config.tests_dir or tests_folder()
        if folder is None:
            self.figure("GPU-marked tests", "not run: no tests folder (run from a checkout)")
            return {"skipped": "no tests folder next to the package"}
        done = run_gpu_tests(Path(folder), max(60.0, self.deadline - time.perf_counter()))
        state = " (timed out)" if done["timed_out"] else ""
        missing = f", {len(done['uncollected'])} modules not collected" if done["uncollected"] else ""
        passed = done["failed"] + done["error"] == 0 and done["passed"] > 0 and not state and not missing
        self.figure("GPU-marked tests", f"{done['passed']} passed, {done['failed']} failed, {done['error']} errors"
                    f"{missing}{state}", "tests", 1.0 if passed else 0.0)  # fmt: skip
        return done


def _top(profile: dict, count: int = 4) -> str:
    """The first ``count`` operations of a ``profiled`` result, by the larger of host and device time."""
    return ", ".join(f"{op['name'][:60]} {max(op['self_ms'], op['self_device_ms']):.0f} ms" for op in profile["ops"][:count])


def profiled(run, device: torch.device) -> dict:
    """``run()`` under the torch profiler: counts of kernel launches from the host, CUDA graph replays, the
    operations that ran on the device (kernels and copies, a replayed graph's included) and host reads
    (``item()``, ``int()``, copies to the host: each a device sync on CUDA), the TOP_OPS operations by their own time, the wall
    time and the device's busy time (each operation's own device time, summed: where it is well under the
    wall time, the host is what the run waits for)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        run()
        _sync(device)()
        wall = time.perf_counter() - started
    events = prof.key_averages()
    count = {event.key: event.count for event in events}
    launches = sum(n for name, n in count.items() if "LaunchKernel" in name)
    host_reads = count.get("aten::_local_scalar_dense", 0) + count.get("cudaStreamSynchronize", 0) + \
        count.get("cudaDeviceSynchronize", 0)  # fmt: skip
    # a replayed CUDA graph is one host call (cudaGraphLaunch) for all its kernels: count what ran on the device
    graphs = count.get("cudaGraphLaunch", 0)
    device_ops = sum(e.count for e in events if e.device_type == DeviceType.CUDA)
    device_time = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    rows = [{"name": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1000,
             "self_device_ms": getattr(e, device_time, 0) / 1000} for e in events]  # fmt: skip
    rows.sort(key=lambda row: max(row["self_ms"], row["self_device_ms"]), reverse=True)
    counts = {"launches": launches, "graph_launches": graphs, "device_ops": device_ops, "host_reads": host_reads}
    return {"counts": counts, "ops": rows[:TOP_OPS], "wall_ms": wall * 1e3,
            "device_ms": sum(row["self_device_ms"] for row in rows)}  # the kernels' time, all streams together


def run_gpu_bench(config: GPUBenchConfig, out: Path) -> dict:
    """Run the chosen sections (then the tests); ``gpu.json`` after each, ``gpu.md`` at the end, in ``out``."""
    run, out = _Run(config), Path(out)
    write_json(out / "gpu.json", run.result)
    reserve = TESTS_RESERVE_S if "tests" in config.sections else 0.0
    for section in config.sections:
        started = time.perf_counter()
        if section == "tests":
            run.release()
            run.result[section] = run.section("tests")
        elif started > run.deadline - reserve:
            run.result[section] = {"skipped": f"past the time budget ({config.budget_s:g} s, tests included)"}
            run.figure(section, "skipped: past the time budget")
        else:
            run.result[section] = run.section(section)
        run.result["section_s"][section] = time.perf_counter() - started
        write_json(out / "gpu.json", run.result)
    run.release()
    (out / "gpu.md").write_text(report(run.result) + "\n")
    return run.result


def report(result: dict) -> str:
    """The heading (machine, model) and one table of every figure against its target."""
    h, c = result["header"], result["config"]
    heading = (
        f"{h['device']} (driver {h['driver']}), torch {h['torch']}, Triton {h['triton']}, CUDA "
        f"{h['cuda_version']}; {c['shape']} (random weights), {c['dtype']}, {result['kernels']} attention"
    )
    cells = [[f["figure"], f["measured"], f["target"], f["met"]] for f in result["figures"]]
    return f"{heading}\n\n{markdown_table(['figure', 'measured', 'target', 'met'], cells)}"
