"""Decode benchmark: speed and fidelity of each decode weight format (``float``, ``q8``, ``q4``).

One model is loaded; ``DecoderLM.quantize_linears`` switches what its decode steps read, so every
format runs in the same process on the same prompts. A format is a weight format (``float``, ``q8``,
``q4``, ``auto``), optionally with ``+layers``: decode steps run layer by layer from Python instead of
as one compiled call (``models/fast_decode.py``).

* **Speed**: for each target prompt length, a MuSiQue question over as many of its passages as come
  closest; Full Reuse (a cheap prefill), then ``speed_tokens`` new tokens; decode tokens per second
  of each format and its ratio to float, one run, formats interleaved per prompt.
* **Fidelity**: for each of ``questions`` questions, the exact (Full Attention) prompt KV is computed
  once in float; each format then decodes greedily from it (free running: is the answer the float
  answer, and where does it first differ?) and again fed the float answer's tokens (teacher forced:
  KL(float || format) of every next-token distribution, and top-1 agreement). "float" here, the
  reference, is ``float+layers``: the float weights run layer by layer. The prefill is the
  same float computation for every format, so the first token never differs.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fusionrag_llm.eval.baselines import LLAMA_CPP, find_llama_cpp, llama_cpp_decode
from fusionrag_llm.eval.bench_data import SYNTHETIC, chunk_texts, closest_request, load_examples
from fusionrag_llm.eval.metrics import kl_divergence
from fusionrag_llm.eval.results import check_ints, fmt, machine_line, markdown_table, write_report
from fusionrag_llm.models.forward import ForwardPass
from fusionrag_llm.models.llama import DECODE_WEIGHTS
from fusionrag_llm.request import RAGRequest

LAYERS = "+layers"  # a format suffix: decode steps run layer by layer (models/fast_decode.py explains)

@dataclass(frozen=True)
class DecodeConfig:
    dataset: str  # "synthetic" or a resolved MuSiQue-format file
    model: str
    formats: tuple[str, ...] = DECODE_WEIGHTS
    lengths: tuple[int, ...] = (512, 3000, 6000)
    speed_tokens: int = 64
    questions: int = 30
    passages: int = 5
    max_new_tokens: int = 32

    def __post_init__(self) -> None:
        if not self.formats:
            raise ValueError(f"at least one format is needed ({ALLOWED})")
        for name in self.formats:
            format_parts(name)
        check_ints(self, ("speed_tokens", "passages", "max_new_tokens"))
        if any(length < 1 for length in self.lengths) or self.questions < 0:
            raise ValueError(f"lengths must be >= 1 and questions >= 0, got {self.lengths}, {self.questions}")

    def to_dict(self) -> dict:
        return asdict(self)


ALLOWED = (f"a weight format ({', '.join(DECODE_WEIGHTS)}), optionally '{LAYERS}' (layer by layer from Python, "
           "not the compiled decode step)")  # fmt: skip


def format_parts(name: str) -> tuple[str, bool]:
    """``"q4"`` -> ``("q4", True)``, ``"q4+layers"`` -> ``("q4", False)``: the weights, and whether
    decode steps may run compiled; ValueError otherwise."""
    weights, layers = name.removesuffix(LAYERS), name.endswith(LAYERS)
    if weights not in DECODE_WEIGHTS:
        raise ValueError(f"decode formats must each be {ALLOWED}, got {name!r}")
    return weights, not layers


def parse_formats(value: str) -> tuple[str, ...]:
    """``"float,q4,q4+layers"`` -> a tuple; ``ValueError`` naming the allowed formats otherwise."""
    formats = tuple(f.strip() for f in value.split(",") if f.strip())
    if not formats:
        raise ValueError(f"decode formats must each be {ALLOWED}, got {value!r}")
    for name in formats:
        format_parts(name)
    return formats


def use_format(model, name: str) -> None:
    """Make the model's decode steps read ``name``'s weights (and run compiled or not)."""
    weights, compiled = format_parts(name)
    model.quantize_linears(weights)
    model.compiled_decode = compiled


def run_speed(rag, config: DecodeConfig, gguf: Path | None = None) -> list[dict]:
    """One row per prompt length: decode tokens/s of each format (same prompt, same process), and of
    llama.cpp on ``gguf`` with the same prompt token ids and threads when ``gguf`` is given."""
    examples = load_examples(config.dataset, 1, passages=10 if config.dataset == SYNTHETIC else None, seed=0)
    passages, question = chunk_texts(examples[0]), examples[0].question
    rows = []
    for target in config.lengths:
        request = closest_request(rag, passages, question, target)
        row = {"target_tokens": target, "prompt_tokens": None, "tokens_per_s": {}}
        for weights in config.formats:
            use_format(rag.engine.model, weights)
            rag.generate(request, method="full_reuse", max_new_tokens=4)  # warm-up
            out = rag.generate(request, method="full_reuse", max_new_tokens=config.speed_tokens)
            row["prompt_tokens"] = out.stats.prompt_tokens
            row["tokens_per_s"][weights] = out.stats.decode_tokens_per_s
        if gguf is not None:
            ids = [t for segment in rag.segments(request) for t in segment.token_ids]
            row["tokens_per_s"][LLAMA_CPP] = llama_cpp_decode(gguf, ids, config.speed_tokens)
        rows.append(row)
    use_format(rag.engine.model, "auto")
    return rows


def run_fidelity(rag, config: DecodeConfig) -> list[dict]:
    """One row per question: each format's free-running answer and teacher-forced KL against float."""
    model = rag.engine.model
    rows = []
    for example in load_examples(config.dataset, config.questions, passages=config.passages, seed=0):
        request = RAGRequest(chunks=chunk_texts(example), question=example.question)
        ids = [t for segment in rag.segments(request) for t in segment.token_ids]
        cache, first = _prefill(model, ids, config.max_new_tokens)
        use_format(model, "float" + LAYERS)  # the reference: float weights, layer by layer
        reference, reference_logits = _decode(model, cache, len(ids), first, config.max_new_tokens)
        row = {"qid": example.id, "prompt_tokens": len(ids), "formats": {}}
        for weights in config.formats:
            use_format(model, weights)
            tokens, _ = _decode(model, cache, len(ids), first, config.max_new_tokens)
            _, forced = _decode(model, cache, len(ids), first, config.max_new_tokens, forced=reference)
            row["formats"][weights] = _compare(reference, reference_logits, tokens, forced)
        rows.append(row)
    use_format(model, "auto")
    return rows


@torch.inference_mode()
def _prefill(model, ids: list[int], room: int):
    cache = model.new_cache(len(ids) + room)
    n = len(ids)
    step = ForwardPass(torch.tensor(ids), torch.arange(n), cache.reserve(n), logit_rows=torch.tensor([n - 1]))
    return cache, int(model(step, cache).logits[0].argmax())


@torch.inference_mode()
def _decode(model, cache, n: int, first: int, count: int, forced: list[int] | None = None):
    """Greedy tokens after ``first`` (or the ``forced`` ones) and each step's logits; the cache is
    rewound to the prompt afterwards."""
    tokens, logits, token = [first], [], first
    for index in range(count - 1):
        step = ForwardPass(torch.tensor([token]), torch.tensor([n + index]), cache.reserve(1), decode=True)
        row = model(step, cache).logits[0]
        logits.append(row)
        token = forced[index + 1] if forced is not None else int(row.argmax())
        tokens.append(token)
    cache.length = n
    cache.valid[n:] = False
    return tokens, torch.stack(logits) if logits else torch.empty(0)


def _compare(reference: list[int], reference_logits, tokens: list[int], forced_logits) -> dict:
    first_difference = next((i for i, (a, b) in enumerate(zip(reference, tokens)) if a != b), None)
    steps = len(reference_logits) > 0  # a one-token answer has no decode step to compare
    kl = kl_divergence(reference_logits, forced_logits) if steps else torch.zeros(1)
    agree = reference_logits.argmax(-1) == forced_logits.argmax(-1) if steps else torch.ones(1)
    return {"same_answer": tokens == reference, "first_difference": first_difference, "kl_mean": float(kl.mean()),
            "kl_max": float(kl.max()), "top1_agreement": float(agree.float().mean())}  # fmt: skip


def summarize(speed: list[dict], fidelity: list[dict], formats) -> dict:
    summary = {}
    for weights in formats:
        rows = [r["formats"][weights] for r in fidelity]
        summary[weights] = {
            "speedup_vs_float": [r["tokens_per_s"][weights] / r["tokens_per_s"]["float"] for r in speed
                                 if "float" in r["tokens_per_s"] and r["tokens_per_s"]["float"] > 0],  # fmt: skip
            "same_answer": sum(r["same_answer"] for r in rows),
            "questions": len(rows),
            "kl_mean": sum(r["kl_mean"] for r in rows) / len(rows) if rows else None,
            "kl_max": max((r["kl_max"] for r in rows), default=None),
            "top1_agreement": sum(r["top1_agreement"] for r in rows) / len(rows) if rows else None,
            "worst_question": max(fidelity, key=lambda r: r["formats"][weights]["kl_mean"])["qid"] if rows else None,
        }
    return summary


def decode_markdown(result: dict, config: dict, machine: dict) -> str:
    formats = config["formats"]
    columns = list(formats) + ([LLAMA_CPP] if result["speed"] and LLAMA_CPP in result["speed"][0]["tokens_per_s"] else [])
    pairs = [(w, base) for base in ("float", LLAMA_CPP) if base in columns for w in formats if w != base]
    speed_rows = [[r["prompt_tokens"], *(fmt(r["tokens_per_s"][w], 1) for w in columns),
                   *(f"{r['tokens_per_s'][w] / r['tokens_per_s'][base]:.2f}x" for w, base in pairs)]
                  for r in result["speed"]]  # fmt: skip
    ratios = [f"{w} vs {base}" for w, base in pairs]
    summary = result["summary"]
    fidelity_rows = [[w, f"{summary[w]['same_answer']}/{summary[w]['questions']}", fmt(summary[w]["top1_agreement"], 3),
                      fmt(summary[w]["kl_mean"], 5), fmt(summary[w]["kl_max"], 4), summary[w]["worst_question"]]
                     for w in formats]  # fmt: skip
    fidelity = (f"## Fidelity against float decode: {config['questions']} questions x {config['passages']} passages, "
                f"{config['max_new_tokens']} new tokens, exact (Full Attention) prompt KV\n\n"
                + markdown_table(["format", "same answer", "top-1 agreement (forced)", "KL mean", "KL max",
                                  "worst question"], fidelity_rows) + "\n") if result["fidelity"] else ""  # fmt: skip
    return (
        f"# Decode: {config['model']}, weight formats {', '.join(formats)}\n\n"
        f"{machine_line(machine)}. One process, one run.\n\n"
        f"## Speed: decode tokens/s, {config['speed_tokens']} new tokens after a Full Reuse prompt\n\n"
        + markdown_table(["prompt tokens", *(f"{w} tok/s" for w in columns), *ratios], speed_rows)
        + f"\n\n{result.get('baseline_note', '')}\n\n" + fidelity
    )


def write_decode(out_dir: Path, config: dict, machine: dict, result: dict) -> list[Path]:
    """decode.json and decode.md in ``out_dir``."""
    return write_report(out_dir, "decode", {"config": config, "machine": machine, **result},
                        decode_markdown(result, config, machine))


def run_decode(rag, config: DecodeConfig, llama_cpp: bool = True) -> dict:
    """Speed and fidelity; llama.cpp is timed too when asked, installed, and the model has a GGUF file."""
    start = time.perf_counter()
    gguf, note = find_llama_cpp(rag.model_name) if llama_cpp else (None, "llama.cpp: not asked for (--baselines none).")
    speed = run_speed(rag, config, gguf)
    fidelity = run_fidelity(rag, config)
    return {"speed": speed, "fidelity": fidelity, "summary": summarize(speed, fidelity, config.formats),
            "baseline_note": note, "seconds": time.perf_counter() - start}  # fmt: skip
