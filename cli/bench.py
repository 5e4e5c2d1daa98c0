"""``fusionrag bench quality|ttft|decode|serve|gpu``: the benchmarks users run.

Each command parses its options into a typed config, runs a runner from ``fusionrag_llm.eval``,
writes JSON, a markdown table (echoed) and plots into ``--out``. Ablations and analysis scripts
live in the repository's ``bench/`` folder, outside the package.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import click

from fusionrag_llm.cli.options import (baselines_option, device_option, dtype_option, engine_option, max_new_tokens_option,
                                       method_options, model_option, neighbors_option, progress_on,
                                       repeats_option)  # fmt: skip

DEFAULT_METHODS = "full_attention,full_reuse,cacheblend,fusionrag_paper,fusionrag"


def _parsed(module: str, name: str):
    """A click callback parsing with ``fusionrag_llm.eval.<module>.<name>`` (imported when used), its
    ValueError as click.BadParameter."""

    def callback(ctx, param, value):
        parser = getattr(importlib.import_module(f"fusionrag_llm.eval.{module}"), name)
        try:
            return parser(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    return callback


_methods = _parsed("bench_data", "parse_methods")
_ratios = _parsed("bench_data", "parse_ratios")
_lengths = _parsed("bench_data", "parse_lengths")
_formats = _parsed("bench_decode", "parse_formats")
_dataset_label = _parsed("bench_data", "dataset_label")


def _dataset(ctx, param, value):
    label = _dataset_label(ctx, param, value)
    if label != "synthetic" and not Path(label).is_file():
        raise click.BadParameter(f"{value!r} is neither 'synthetic' nor an existing MuSiQue-format JSON file")
    return label


def _one_length(ctx, param, value):
    lengths = _lengths(ctx, param, value)
    if len(lengths) != 1:
        raise click.BadParameter(f"takes one prompt length here, got {value!r}")
    return lengths[0]


def _question_range(ctx, param, value) -> tuple[int, int | None]:
    """``N`` (the first N questions) or ``A-B`` (questions A to B, from 1) -> (questions skipped, count)."""
    if value is None:
        return 0, None
    first, sep, last = value.partition("-")
    try:
        start, stop = (int(first), int(last)) if sep else (1, int(first))
    except ValueError:
        start = stop = 0
    if not 1 <= start <= stop:
        raise click.BadParameter(f"expected N or A-B with 1 <= A <= B (e.g. 20 or 31-60), got {value!r}")
    return start - 1, stop - start + 1


def _ints(ctx, param, value):
    try:
        levels = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated ints such as 1,4,16, got {value!r}") from None
    if any(level < 1 for level in levels):
        raise click.BadParameter(f"every value must be >= 1, got {value!r}")
    return levels


dataset_option = click.option("--dataset", default=None, callback=_dataset,
                              help="'synthetic' or a MuSiQue-format JSON file [default: ../shared/data/musique_dev.json].")  # fmt: skip
methods_option = click.option("--method", "methods", default=DEFAULT_METHODS, show_default=True, callback=_methods,
                              help="Methods to compare, comma-separated; full_attention and full_reuse are always run.")  # fmt: skip
store_option = click.option("--store", default=None, type=click.Path(file_okay=False),
                            help="KV store folder (resumed runs skip the offline stage); default: a temporary folder, removed after the run.")  # fmt: skip
kv_codec_option = engine_option(("kv_codec",), {"kv_codec": "model"},
                                "kv_codec=C: how the store keeps chunk KV; default model (the compute dtype, lossless), "
                                "as every earlier recorded run.")  # fmt: skip


def ratios_option(default: str):
    return click.option("--ratio", "ratios", default=default, show_default=True, callback=_ratios,
                        help="Recompute ratios, comma-separated.")  # fmt: skip


def lengths_option(default: str, help: str = "Prompt lengths in tokens."):
    return click.option("--lengths", default=default, show_default=True, callback=_lengths, help=help)


def passages_option(default: int):
    return click.option("--passages", default=default, show_default=True, type=click.IntRange(1),
                        help="Passages per question.")  # fmt: skip


def out_option(command):
    return click.option("--out", default="bench_results", show_default=True, type=click.Path(file_okay=False),
                        help="Folder for the JSON, table and plots.")(command)  # fmt: skip


def _echo_outputs(paths) -> None:
    markdown = next((p for p in paths if p.suffix == ".md"), None)
    if markdown is not None:
        click.echo(markdown.read_text())
    click.echo("wrote " + ", ".join(str(p) for p in paths))


class _BenchCommand(click.Command):
    """A bench command: a ValueError (FusionRAGError and DatasetError are ValueErrors) ends it as a
    clean CLI error, not a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None


class _BenchGroup(click.Group):
    command_class = _BenchCommand


@click.group(cls=_BenchGroup)
def bench() -> None:
    """Benchmarks: answer quality and fidelity, time to first token, decode speed, serving, GPU."""


@bench.command()
@dataset_option
@methods_option
@ratios_option("0,0.05,0.1,0.15,0.3,1")
@passages_option(10)
@click.option("--questions", "question_range", default=None, metavar="N|A-B", callback=_question_range,
              help="The first N questions, or questions A to B counted from 1 (held-out runs, e.g. 31-60) "
                   "[default: all; synthetic: 20].")  # fmt: skip
@model_option
@device_option
@dtype_option
@neighbors_option(10)
@max_new_tokens_option(32)
@out_option
@store_option
@kv_codec_option
def quality(dataset, methods, ratios, passages, question_range, model, device, dtype, neighbors, max_new_tokens, out,
            store, engine_options) -> None:  # fmt: skip
    """F1/EM vs gold answers and fidelity to Full Attention (KL, first token, greedy EM) per method and ratio."""
    from fusionrag_llm.eval.bench_data import load_examples, open_bench_rag
    from fusionrag_llm.eval.bench_quality import QualityConfig, records_of_run, run_quality
    from fusionrag_llm.eval.partial_log import PartialLog
    from fusionrag_llm.eval.quality_report import aggregate, write_quality
    from fusionrag_llm.eval.results import machine_info

    skip, limit = question_range
    kv_codec = engine_options["kv_codec"] or "model"
    config = QualityConfig(dataset, model, methods, ratios, passages, limit, neighbors, max_new_tokens,
                           device=device, dtype=dtype, skip=skip, kv_codec=kv_codec)  # fmt: skip
    examples = load_examples(dataset, limit, passages, config.seed, config.words_per_passage, skip)
    log = PartialLog(Path(out) / "quality.partial.jsonl", config.identity())
    rag = open_bench_rag(model, device, dtype, store, kv_codec)
    run = run_quality(rag, examples, config, log, progress=progress_on())
    click.echo(f"records: {run.computed} computed, {run.skipped} resumed from {log.path}")
    records = records_of_run(log, examples, config)
    rows = aggregate(records, methods, ratios, [ex.id for ex in examples])
    _echo_outputs(write_quality(Path(out), config.to_dict(), machine_info(rag), vars(run), records, rows))


@bench.command()
@lengths_option("1000,2000,4000")
@methods_option
@ratios_option("0.15")
@dataset_option
@model_option
@device_option
@dtype_option
@neighbors_option(10)
@repeats_option(3)
@baselines_option("transformers", ("transformers", "llama_cpp"),
                  "Also time these on the same prompt ids: transformers, llama_cpp (the model's GGUF; needs "
                  "llama-cpp-python), a comma list, or none.")  # fmt: skip
@max_new_tokens_option(1, None, "Tokens each run decodes (end tokens ignored); above 1 adds an end-to-end table "
                                "(TTFT + N tokens).")  # fmt: skip
@out_option
@store_option
def ttft(lengths, methods, ratios, dataset, model, device, dtype, neighbors, repeats, baselines, max_new_tokens, out,
         store) -> None:  # fmt: skip
    """Time to first token (median, with load/select/prefill) per method, ratio and prompt length."""
    from fusionrag_llm.eval.bench_data import open_bench_rag
    from fusionrag_llm.eval.bench_ttft import TTFTConfig, build_prompts, ingest_prompts, run_ttft, source_passages, write_ttft
    from fusionrag_llm.eval.baselines import find_llama_cpp, load_hf_twin
    from fusionrag_llm.eval.results import machine_info

    config = TTFTConfig(dataset, model, lengths, methods, ratios, repeats, neighbors, device=device, dtype=dtype,
                        baselines=baselines, new_tokens=max_new_tokens)  # fmt: skip
    rag = open_bench_rag(model, device, dtype, store)
    gguf, note = find_llama_cpp(rag.model_name) if "llama_cpp" in baselines else (None, "")
    if "llama_cpp" in baselines:
        click.echo(note)
    question, passages = source_passages(dataset, max(lengths), config.seed)
    prompts = build_prompts(rag, question, passages, lengths)
    offline = ingest_prompts(rag, prompts, neighbors, progress=progress_on(), methods=config.methods)
    hf_model = load_hf_twin(rag.engine.loaded) if "transformers" in baselines else None
    rows = run_ttft(rag, prompts, config, hf_model, gguf, progress=progress_on())
    _echo_outputs(write_ttft(Path(out), config.to_dict(), machine_info(rag), offline, rows, note))


@bench.command()
@dataset_option
@click.option("--formats", default="float,q8,q4,q4+layers", show_default=True, callback=_formats,
              help="Decode weight formats (float, q8, q4, auto), each optionally with '+layers': decode steps run "
                   "layer by layer from Python instead of as one compiled call.")  # fmt: skip
@lengths_option("512,3000,6000", "Prompt lengths (tokens) for the speed table.")
@click.option("--speed-tokens", default=64, show_default=True, type=click.IntRange(1, 512), help="New tokens per speed run.")
@click.option("--questions", default=30, show_default=True, type=click.IntRange(0), help="Questions for the fidelity table.")
@passages_option(5)
@max_new_tokens_option(32)
@baselines_option("llama_cpp", ("llama_cpp",),
                  "Also time llama_cpp's decode (llama.cpp on the model's GGUF file, when llama-cpp-python is "
                  "installed), or none.")  # fmt: skip
@model_option
@out_option
def decode(dataset, formats, lengths, speed_tokens, questions, passages, max_new_tokens, baselines, model, out) -> None:
    """Decode tokens/s and fidelity of float, 8-bit and 4-bit decode weights (same process, same prompts),
    against llama.cpp on the same prompt ids."""
    from fusionrag_llm.eval.bench_data import open_bench_rag
    from fusionrag_llm.eval.bench_decode import DecodeConfig, run_decode, write_decode
    from fusionrag_llm.eval.results import machine_info

    rag = open_bench_rag(model, "cpu", None, None)
    config = DecodeConfig(dataset, model, formats, lengths, speed_tokens, questions, passages, max_new_tokens)
    result = run_decode(rag, config, llama_cpp="llama_cpp" in baselines)
    _echo_outputs(write_decode(Path(out), config.to_dict(), machine_info(rag), result))


@bench.command()
@dataset_option
@click.option("--questions", default=16, show_default=True, type=click.IntRange(1), help="Requests per level, one question each.")
@click.option("--lengths", "tokens", default="1024", show_default=True, callback=_one_length,
              help="Target prompt length in tokens (one here).")  # fmt: skip
@max_new_tokens_option(32)
@click.option("--concurrency", default="1,4,16", show_default=True, callback=_ints, help="Concurrent clients per level.")
@method_options
@model_option
@device_option
@dtype_option
@neighbors_option(3)
@out_option
@store_option
def serve(dataset, questions, tokens, max_new_tokens, concurrency, method, ratio, model, device, dtype, neighbors, out,
          store) -> None:  # fmt: skip
    """The OpenAI-compatible server under concurrent streaming clients: throughput, TTFT p50/p95."""
    from fusionrag_llm.eval.bench_data import add_chunks, open_bench_rag, workload_requests
    from fusionrag_llm import get_method
    from fusionrag_llm.eval.bench_serve import ServeConfig, run_serve, write_serve
    from fusionrag_llm.eval.results import machine_info

    rag = open_bench_rag(model, device, dtype, store)
    ratio = get_method(method).check_ratio(ratio)  # None: the method's own
    config = ServeConfig(dataset, model, questions, tokens, max_new_tokens, concurrency, method, ratio, neighbors)
    prompts = workload_requests(rag, dataset, questions, tokens)
    start = time.perf_counter()
    pool = list(dict.fromkeys(chunk for prompt in prompts for chunk in prompt.chunks))
    add_chunks(rag, pool, neighbors, progress=progress_on())
    offline = {"chunks": len(pool), "seconds": time.perf_counter() - start}
    result = run_serve(rag, prompts, config)
    _echo_outputs(write_serve(Path(out), config.to_dict(), machine_info(rag), offline, result))


@bench.command()
@click.option("--model", "shape", default="llama3-8b", show_default=True, type=click.Choice(["llama3-8b", "qwen2.5-7b", "small"]),
              help="A random-weight model of this shape (no download).")  # fmt: skip
@device_option
@dtype_option
@lengths_option("8192,16384,32768", "Context lengths in tokens of chunks (512 per chunk) for TTFT; the longest "
                                    "also for end to end and the attention keys.")  # fmt: skip
@click.option("--sections", default="all", show_default=True,
              callback=lambda ctx, param, value: tuple(value.split(",")),
              help="Comma-separated: add_chunks, decode, ttft, e2e, attention, profile (launches and syncs per decode step), layerwise (entries in host memory, "
                   "placed whole or layer by layer), tests (the GPU-marked tests); all: every one but layerwise, "
                   "tests only with CUDA.")  # fmt: skip
@repeats_option(5)
@max_new_tokens_option(128, None, "Tokens each decode and end-to-end run generates (end tokens ignored).")
@click.option("--concurrency", default="8,32", show_default=True, callback=_ints,
              help="Requests decoded at once through generate_many.")  # fmt: skip
@engine_option(("kernels",), help="kernels=K: the model's attention backend, auto (Triton on CUDA), torch or triton; "
                                  "default $FUSIONRAG_KERNELS, else auto.")  # fmt: skip
@out_option
def gpu(shape, device, dtype, lengths, sections, repeats, max_new_tokens, concurrency, engine_options, out) -> None:
    """Every GPU figure against its target: decode tokens/s, TTFT and end to end against Full Attention,
    the recompute attention against FlexAttention and causal SDPA, add_chunks; then the GPU-marked tests."""
    from fusionrag_llm.eval.bench_gpu import GPUBenchConfig, run_gpu_bench

    kernels = engine_options.get("kernels")  # None: $FUSIONRAG_KERNELS, else auto
    kernels = None if kernels is None else str(kernels)
    config = GPUBenchConfig(shape, device or "cuda", dtype or "bfloat16", tuple(lengths), repeats, sections,
                            max_new_tokens, concurrency, kernels=kernels)  # fmt: skip
    result = run_gpu_bench(config, Path(out))
    _echo_outputs([Path(out) / "gpu.json", Path(out) / "gpu.md"])
    if failed := [name for name in config.sections if "raised" in result.get(name, {})]:
        raise click.ClickException(f"section(s) {', '.join(failed)} failed; the errors are in {Path(out) / 'gpu.json'}")
