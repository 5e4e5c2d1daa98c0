"""``fusionrag bench quality|ttft|ingest|store|batch|decode|resolve|preload``: the benchmarks of docs/BENCHMARKS.md.

Each command parses its options into a typed config, runs a runner from ``fusionrag_llm.eval``,
writes JSON, a markdown table (echoed) and plots into ``--out``.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from fusionrag_llm.cli.options import device_option, dtype_option, kv_codec_option, model_option, workers_option
from fusionrag_llm import DEFAULT_FUSED_ORDER, FUSED_ORDERS

DEFAULT_METHODS = "full_attention,full_reuse,cacheblend,fusionrag,fused+kv_deviation,plain+query_guided"


def _parsed(parser):
    """A click callback that turns a parser's ValueError into click.BadParameter."""

    def callback(ctx, param, value):
        try:
            return parser(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    return callback


def _dataset(ctx, param, value):
    from fusionrag_llm.eval.bench_data import dataset_label

    try:
        label = dataset_label(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if label != "synthetic" and not Path(label).is_file():
        raise click.BadParameter(f"{value!r} is neither 'synthetic' nor an existing MuSiQue-format JSON file")
    return label


def _methods(ctx, param, value):
    from fusionrag_llm.eval.bench_methods import parse_methods

    return _parsed(parse_methods)(ctx, param, value)


def _ratios(ctx, param, value):
    from fusionrag_llm.eval.bench_methods import parse_ratios

    return _parsed(parse_ratios)(ctx, param, value)


def _parsed_baselines(ctx, param, value):
    from fusionrag_llm.eval.bench_ttft import parse_baselines

    return _parsed(parse_baselines)(ctx, param, value)


def _lengths(ctx, param, value):
    from fusionrag_llm.eval.bench_methods import parse_lengths

    return _parsed(parse_lengths)(ctx, param, value)


dataset_option = click.option("--dataset", default=None, callback=_dataset,
                              help="'synthetic' or a MuSiQue-format JSON file [default: ../shared/data/musique_dev.json].")  # fmt: skip
methods_option = click.option("--methods", default=DEFAULT_METHODS, show_default=True, callback=_methods,
                              help="Methods, or ablations '<plain|fused>+<selector>', each optionally with ':<variant_policy>', '~<kv_shift>' (e.g. fusionrag~0) and '@<decode KV budget>' (e.g. a3@64); full_attention and full_reuse are always run.")  # fmt: skip
neighbors_option = click.option("--neighbors", default=10, show_default=True, type=click.IntRange(0), help="Fusion neighbours per chunk.")
seed_option = click.option("--seed", default=0, show_default=True, type=int, help="Synthetic data and random-selector seed.")
store_option = click.option("--store", default=None, type=click.Path(file_okay=False),
                            help="KV store folder (disk tier); default: memory only.")  # fmt: skip
host_option = click.option("--host-gib", default=4.0, show_default=True, type=click.FloatRange(0.01), help="Host-memory budget of the KV store.")
disk_option = click.option("--disk-gib", default=20.0, show_default=True, type=click.FloatRange(0.01), help="Disk budget of --store.")
progress_option = click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bars on stderr.")


def out_option(default: str):
    return click.option("--out", default=default, show_default=True, type=click.Path(file_okay=False),
                        help="Folder for the JSON, table and plots.")  # fmt: skip


def _load(model: str, device: str | None, dtype: str | None, store: str | None, host_gib: float, disk_gib: float,
          kv_codec: str | None = None):  # fmt: skip
    from fusionrag_llm.eval.bench_data import open_bench_rag

    try:
        return open_bench_rag(model, device, dtype, store, host_gib, disk_gib, kv_codec)
    except ValueError as exc:  # FusionRAGError and bad budgets
        raise click.ClickException(str(exc)) from None


def _echo_outputs(paths) -> None:
    markdown = next((p for p in paths if p.suffix == ".md"), None)
    if markdown is not None:
        click.echo(markdown.read_text())
    click.echo("wrote " + ", ".join(str(p) for p in paths))


@click.group()
def bench() -> None:
    """Benchmarks: answer quality and fidelity, time to first token, ingest throughput."""


@bench.command()
@dataset_option
@methods_option
@click.option("--ratios", default="0,0.05,0.1,0.15,0.3,1", show_default=True, callback=_ratios, help="Recompute ratios.")
@click.option("--passages", default=10, show_default=True, type=click.IntRange(1), help="Passages per question.")
@click.option("--limit", default=None, type=click.IntRange(1), help="First N questions [default: all; synthetic: 20].")
@click.option("--skip", default=0, show_default=True, type=click.IntRange(0), help="Questions dropped before the first of --limit (held-out runs).")
@click.option("--words-per-passage", default=60, show_default=True, type=click.IntRange(1), help="Synthetic passage length.")
@model_option
@device_option
@dtype_option
@neighbors_option
@click.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1, 512), help="Most tokens to generate per answer.")
@seed_option
@out_option("bench_results")
@click.option("--fresh", is_flag=True, help="Discard records of an earlier run in --out instead of resuming.")
@store_option
@host_option
@disk_option
@progress_option
@click.option("--fused-order", default=DEFAULT_FUSED_ORDER, show_default=True, type=click.Choice(FUSED_ORDERS),
              help="Layout of the fused entries ingested and read: neighbours most similar first (the paper's), "
                   "most similar last, or in registration order.")  # fmt: skip
@kv_codec_option("model", ", lossless, as every earlier recorded run")
def quality(dataset, methods, ratios, passages, limit, skip, words_per_passage, model, device, dtype, neighbors,
            max_new_tokens, seed, out, fresh, store, host_gib, disk_gib, progress, fused_order, kv_codec) -> None:  # fmt: skip
    """F1/EM vs gold answers and fidelity to Full Attention (KL, first token, greedy EM) per method and ratio."""
    from fusionrag_llm.eval.bench_data import load_examples
    from fusionrag_llm.eval.bench_quality import QualityConfig, records_of_run, run_quality
    from fusionrag_llm.eval.partial_log import PartialLog
    from fusionrag_llm.eval.quality_report import aggregate, write_quality
    from fusionrag_llm.eval.results import machine_info

    config = QualityConfig(dataset, model, methods, ratios, passages, limit, neighbors, max_new_tokens, seed,
                           words_per_passage, device, dtype, skip, fused_order, kv_codec or "model")  # fmt: skip
    try:
        examples = load_examples(dataset, limit, passages, seed, words_per_passage, skip)
        log = PartialLog(Path(out) / "quality.partial.jsonl", config.identity(), fresh=fresh)
        rag = _load(model, device, dtype, store, host_gib, disk_gib, kv_codec)
        run = run_quality(rag, examples, config, log, progress=progress)
    except ValueError as exc:  # FusionRAGError and DatasetError are ValueErrors
        raise click.ClickException(str(exc)) from None
    click.echo(f"records: {run.computed} computed, {run.skipped} resumed from {log.path}")
    records = records_of_run(log, examples, config)
    rows = aggregate(records, methods, ratios, [ex.id for ex in examples])
    _echo_outputs(write_quality(Path(out), config.to_dict(), machine_info(rag), vars(run), records, rows))


@bench.command()
@click.option("--lengths", default="1000,2000,4000", show_default=True, callback=_lengths, help="Prompt lengths in tokens.")
@methods_option
@click.option("--ratios", default="0.15", show_default=True, callback=_ratios, help="Recompute ratios.")
@dataset_option
@model_option
@device_option
@dtype_option
@neighbors_option
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1), help="Timed runs after one warm-up.")
@click.option("--baselines", default="transformers", show_default=True, callback=_parsed_baselines,
              help="Also time these on the same prompt ids: transformers, llama_cpp (the model's GGUF; needs "
                   "llama-cpp-python), a comma list, or none.")  # fmt: skip
@click.option("--new-tokens", default=1, show_default=True, type=click.IntRange(1),
              help="Tokens each run decodes (end tokens ignored); above 1 adds an end-to-end table (TTFT + N tokens).")  # fmt: skip
@seed_option
@out_option("bench_results")
@store_option
@host_option
@disk_option
@progress_option
def ttft(lengths, methods, ratios, dataset, model, device, dtype, neighbors, repeats, baselines, new_tokens, seed, out,
         store, host_gib, disk_gib, progress) -> None:  # fmt: skip
    """Time to first token (median, with load/select/prefill) per method, ratio and prompt length."""
    from fusionrag_llm.eval.bench_ttft import TTFTConfig, build_prompts, ingest_prompts, run_ttft, source_passages, write_ttft
    from fusionrag_llm.eval.hf_baseline import load_hf_twin
    from fusionrag_llm.eval.llama_cpp_baseline import find_llama_cpp
    from fusionrag_llm.eval.results import machine_info

    config = TTFTConfig(dataset, model, lengths, methods, ratios, repeats, neighbors, seed, device, dtype, baselines,
                        new_tokens)  # fmt: skip
    rag = _load(model, device, dtype, store, host_gib, disk_gib)
    gguf, note = find_llama_cpp(rag.model_name) if "llama_cpp" in baselines else (None, "")
    if "llama_cpp" in baselines:
        click.echo(note)
    try:
        question, passages = source_passages(dataset, max(lengths), seed)
        prompts = build_prompts(rag, question, passages, lengths)
        offline = ingest_prompts(rag, prompts, neighbors, progress=progress, methods=config.methods)
        hf_model = load_hf_twin(rag.parts.loaded) if "transformers" in baselines else None
        rows = run_ttft(rag, prompts, config, hf_model, gguf, progress=progress)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    _echo_outputs(write_ttft(Path(out), config.to_dict(), machine_info(rag), offline, rows, note))


@bench.command()
@click.option("--chunks", default=100, show_default=True, type=click.IntRange(1), help="Chunks to ingest.")
@dataset_option
@model_option
@device_option
@dtype_option
@neighbors_option
@seed_option
@out_option("bench_results")
@store_option
@host_option
@disk_option
@progress_option
@workers_option
def ingest(chunks, dataset, model, device, dtype, neighbors, seed, out, store, host_gib, disk_gib, progress,
           workers) -> None:  # fmt: skip
    """Offline-stage throughput (plain and fused chunks/min) and KV store size; --workers needs --store."""
    from fusionrag_llm.eval.bench_ingest import IngestConfig, ingest_texts, run_ingest, write_ingest
    from fusionrag_llm.eval.results import machine_info

    config = IngestConfig(dataset, model, chunks, neighbors, seed, store, device, dtype, workers)
    rag = _load(model, device, dtype, store, host_gib, disk_gib)
    try:
        texts = ingest_texts(dataset, chunks, seed)
        result = run_ingest(rag, texts, neighbors, progress=progress, workers=workers)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    _echo_outputs(write_ingest(Path(out), config.to_dict(), machine_info(rag), result))


@bench.command()
@dataset_option
@click.option("--passages", default=10, show_default=True, type=click.IntRange(1), help="Passages per request.")
@click.option("--requests", default=4, show_default=True, type=click.IntRange(1), help="Distinct requests for the overlap run.")
@click.option("--ratio", default=0.15, show_default=True, type=click.FloatRange(0, 1), help="fusionrag recompute ratio.")
@model_option
@click.option("--neighbors", default=4, show_default=True, type=click.IntRange(0), help="Fusion neighbours per chunk.")
@seed_option
@out_option("bench_results")
@click.option("--store", default=None, type=click.Path(file_okay=False), help="Store folder to fill (default: a new temporary one).")
@click.option("--remote", default=None, metavar="URL",
              help="A Redis server (redis://127.0.0.1:6379/0): also time loading one entry from the remote tier.")
def store(dataset, passages, requests, ratio, model, neighbors, seed, out, store, remote) -> None:
    """Loading a context from each tier vs computing it; TTFT with entries on disk vs in memory;
    loading hidden by the asynchronous scheduler; with --remote, load time per entry per tier."""
    import json

    from fusionrag_llm.eval.bench_data import load_examples
    from fusionrag_llm.eval.bench_store import StoreBenchConfig, run_store_benchmark, store_markdown

    try:
        examples = load_examples(dataset, requests + 1, passages, seed)
        config = StoreBenchConfig(model, ratio, neighbors, requests, remote=remote)
        result = run_store_benchmark(examples, config, store)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "store.json").write_text(json.dumps(result, indent=2))
    (folder / "store.md").write_text(store_markdown(result) + "\n")
    _echo_outputs([folder / "store.json", folder / "store.md"])


def workload_options(requests: int, requests_help: str, extra=()):
    """The options of benchmarks that send many requests of one method: dataset, sizes, method, engine, output."""
    options = [dataset_option,
               click.option("--requests", default=requests, show_default=True, type=click.IntRange(1), help=requests_help),
               click.option("--tokens", default=1024, show_default=True, type=click.IntRange(1), help="Target prompt length in tokens."),
               click.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1, 512),
                            help="Most tokens to generate per answer."),
               *extra,
               click.option("--method", default="fusionrag", show_default=True, help="Method every request runs."),
               click.option("--ratio", default=0.15, show_default=True, type=click.FloatRange(0, 1), help="Recompute ratio."),
               model_option, device_option, dtype_option,
               click.option("--neighbors", default=3, show_default=True, type=click.IntRange(0), help="Fusion neighbours per chunk."),
               seed_option, out_option("bench_results"), store_option, host_option, disk_option, progress_option]  # fmt: skip

    def apply(command):
        for option in reversed(options):
            command = option(command)
        return command

    return apply


@bench.command()
@workload_options(8, "Requests (one question each).")
def batch(dataset, requests, tokens, max_new_tokens, method, ratio, model, device, dtype, neighbors, seed, out,
          store, host_gib, disk_gib, progress) -> None:  # fmt: skip
    """Throughput of generate_many (one batch) against the same requests one by one; same answers."""
    from fusionrag_llm.eval.bench_batch import BatchConfig, run_batch, write_batch
    from fusionrag_llm.eval.results import machine_info

    rag = _load(model, device, dtype, store, host_gib, disk_gib)
    try:
        config = BatchConfig(dataset, model, requests, tokens, max_new_tokens, method, ratio, neighbors, seed)
        prompts, offline = _ingested_requests(rag, config, progress)
        result = run_batch(rag, prompts, config)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    _echo_outputs(write_batch(Path(out), config.to_dict(), machine_info(rag), offline, result))


def _ingested_requests(rag, config, progress: bool):
    """The workload's requests (``bench_batch.build_requests``) with their passages ingested first;
    and what that offline stage took."""
    from fusionrag_llm.eval.bench_batch import build_requests

    prompts = build_requests(rag, config)
    start = time.perf_counter()
    report = rag.ingest(list(dict.fromkeys(c for p in prompts for c in p.chunks)), neighbors=config.neighbors,
                        progress=progress)  # fmt: skip
    return prompts, {"chunks": len(report.chunk_ids), "seconds": time.perf_counter() - start}


def _concurrency(ctx, param, value):
    try:
        levels = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated ints such as 1,4,16, got {value!r}") from None
    if any(level < 1 for level in levels):
        raise click.BadParameter(f"every level must be >= 1, got {value!r}")
    return levels


@bench.command()
@workload_options(16, "Requests per level (one question each).", extra=(
    click.option("--concurrency", default="1,4,16", show_default=True, callback=_concurrency, help="Concurrent clients per level."),))
def serve(dataset, requests, tokens, max_new_tokens, concurrency, method, ratio, model, device, dtype, neighbors, seed,
          out, store, host_gib, disk_gib, progress) -> None:  # fmt: skip
    """The OpenAI-compatible server under concurrent streaming clients: throughput, TTFT p50/p95."""
    from fusionrag_llm.eval.bench_serve import ServeConfig, run_serve, write_serve
    from fusionrag_llm.eval.results import machine_info

    rag = _load(model, device, dtype, store, host_gib, disk_gib)
    try:
        config = ServeConfig(dataset, model, requests, tokens, max_new_tokens, concurrency, method, ratio, neighbors, seed)
        prompts, offline = _ingested_requests(rag, config, progress)
        result = run_serve(rag, prompts, config)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    _echo_outputs(write_serve(Path(out), config.to_dict(), machine_info(rag), offline, result))


@bench.command()
@dataset_option
@click.option("--turns", default=5, show_default=True, type=click.IntRange(1, 6), help="Turns of the chat.")
@click.option("--window", default=3, show_default=True, type=click.IntRange(1), help="Passages per turn (one new per turn).")
@click.option("--requests", default=12, show_default=True, type=click.IntRange(1), help="Requests of the reordering run.")
@click.option("--pool", default=8, show_default=True, type=click.IntRange(1), help="Passages they share.")
@click.option("--per-request", default=4, show_default=True, type=click.IntRange(1), help="Passages per request.")
@click.option("--max-new-tokens", default=16, show_default=True, type=click.IntRange(1, 512), help="Most tokens per answer.")
@click.option("--method", default="fusionrag", show_default=True, help="Method every request runs.")
@click.option("--ratio", default=0.15, show_default=True, type=click.FloatRange(0, 1), help="Recompute ratio.")
@model_option
@device_option
@dtype_option
@click.option("--neighbors", default=3, show_default=True, type=click.IntRange(0), help="Fusion neighbours per chunk.")
@seed_option
@out_option("bench_results")
def reuse(dataset, turns, window, requests, pool, per_request, max_new_tokens, method, ratio, model, device, dtype,
          neighbors, seed, out) -> None:  # fmt: skip
    """Multi-turn reuse and de-duplication on a chat, and reordering on requests sharing passages."""
    from fusionrag_llm import FusionRAG
    from fusionrag_llm.eval.bench_data import load_examples
    from fusionrag_llm.eval.bench_reuse import ReuseConfig, run_reorder, run_turns, shared_chunk_requests, write_reuse
    from fusionrag_llm.eval.results import machine_info

    try:
        rag = FusionRAG.from_pretrained(model, device=device, dtype=dtype, store=":memory:")  # the prefix cache on
        config = ReuseConfig(dataset, model, turns, window, requests, pool, per_request, max_new_tokens, method, ratio,
                             neighbors, seed)  # fmt: skip
        examples = load_examples(dataset, max(requests, 1), passages=max(pool, turns + window - 1), seed=seed)
        passages = [p.text for p in examples[0].passages]
        rag.ingest(passages, neighbors=neighbors)
        chat = run_turns(rag, passages, examples[0].question, config)
        shared = shared_chunk_requests(passages, [ex.question for ex in examples], config)

        def fresh():
            engine = FusionRAG(rag.parts.loaded, store=":memory:", embedder=rag.embedder, turn_cache_gib=2.0)
            engine.ingest(passages[:pool], neighbors=neighbors)
            return engine

        result = {"turns": chat, "reorder": run_reorder(fresh, shared, config)}
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    _echo_outputs(write_reuse(Path(out), config.to_dict(), machine_info(rag), result))


def _formats(ctx, param, value):
    from fusionrag_llm.eval.bench_decode import parse_formats

    return _parsed(parse_formats)(ctx, param, value)


@bench.command()
@dataset_option
@click.option("--formats", default="float,q8,q4,q4+layers,q4/float16", show_default=True, callback=_formats,
              help="Decode formats: weights (float, q8, q4, auto), each optionally with '/float16' or '/bfloat16', "
                   "the precision decode steps read the request KV in, and optionally '+layers': decode steps run "
                   "layer by layer from Python instead of as one compiled call.")  # fmt: skip
@click.option("--lengths", default="512,3000,6000", show_default=True, callback=_lengths, help="Prompt lengths (tokens) for the speed table.")
@click.option("--speed-tokens", default=64, show_default=True, type=click.IntRange(1, 512), help="New tokens per speed run.")
@click.option("--questions", default=30, show_default=True, type=click.IntRange(0), help="Questions for the fidelity table.")
@click.option("--passages", default=5, show_default=True, type=click.IntRange(1), help="Passages per fidelity question.")
@click.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1, 512), help="Answer length for fidelity.")
@click.option("--llama-cpp/--no-llama-cpp", default=True, show_default=True,
              help="Also time llama.cpp's decode on the model's GGUF file (when llama-cpp-python is installed).")  # fmt: skip
@model_option
@out_option("bench_results")
def decode(dataset, formats, lengths, speed_tokens, questions, passages, max_new_tokens, llama_cpp, model, out) -> None:
    """Decode tokens/s and fidelity of float, 8-bit and 4-bit decode weights (same process, same prompts)."""
    from fusionrag_llm.eval.bench_decode import DecodeConfig, run_decode, write_decode
    from fusionrag_llm.eval.results import machine_info

    rag = _load(model, "cpu", None, None, 4.0, 1.0)
    try:
        config = DecodeConfig(dataset, model, formats, lengths, speed_tokens, questions, passages, max_new_tokens)
        result = run_decode(rag, config, llama_cpp=llama_cpp)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    _echo_outputs(write_decode(Path(out), config.to_dict(), machine_info(rag), result))


@bench.command()
@click.option("--sizes", default="1024,2048,4096,8192,16384,32768", show_default=True, callback=_lengths,
              help="Prompt lengths in tokens of chunks.")  # fmt: skip
@click.option("--chunk-tokens", default=128, show_default=True, type=click.IntRange(8), help="Tokens per chunk.")
@click.option("--method", default="fusionrag", show_default=True, help="A method that reuses chunk entries.")
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(1), help="Timed runs per size (median).")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1), help="torch CPU threads during the run.")
@out_option("bench_results")
def resolve(sizes, chunk_tokens, method, repeats, threads, out) -> None:
    """Cost of planning and assembling a request's context per prompt token, 1k to 32k tokens (tiny model)."""
    from fusionrag_llm.eval.bench_resolve import ResolveBenchConfig, run_resolve_bench

    try:
        config = ResolveBenchConfig(sizes=sizes, chunk_tokens=chunk_tokens, method=method, repeats=repeats,
                                    threads=threads, out=Path(out))  # fmt: skip
        run_resolve_bench(config)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    _echo_outputs([Path(out) / "resolve.json", Path(out) / "resolve.md"])


@bench.command()
@click.option("--shape", default="llama3-8b", show_default=True, type=click.Choice(["llama3-8b", "qwen2.5-7b", "small"]),
              help="A random-weight model of this shape (no download).")  # fmt: skip
@click.option("--device", default="cuda", show_default=True, help="Where the model runs.")
@click.option("--dtype", default="bfloat16", show_default=True, type=click.Choice(["bfloat16", "float16", "float32"]))
@click.option("--contexts", default="8192,16384,32768", show_default=True, callback=_lengths,
              help="Prompt lengths in tokens of chunks (512 per chunk).")  # fmt: skip
@click.option("--tiers", default="host,device", show_default=True,
              callback=lambda ctx, param, value: [t for t in value.split(",") if t],
              help="Where the entries live: host (pinned memory) and/or device (GPU memory).")  # fmt: skip
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(1), help="Timed runs per mode (median).")
@click.option("--kernels", default="auto", show_default=True, type=click.Choice(["auto", "torch", "triton"]),
              help="Attention backend of the model (auto: Triton on CUDA).")  # fmt: skip
@out_option("bench_results")
def preload(shape, device, dtype, contexts, tiers, repeats, kernels, out) -> None:
    """TTFT with stored KV placed whole before the prefill or layer by layer during it (Cache-Craft)."""
    from fusionrag_llm.eval.bench_preload import run_preload_bench

    unknown = [t for t in tiers if t not in ("host", "device")]
    if unknown or not tiers:
        raise click.ClickException(f"--tiers takes host and/or device, got {','.join(tiers) or 'nothing'}")
    try:
        run_preload_bench(shape, device, dtype, contexts, tiers, repeats, Path(out), kernels)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    _echo_outputs([Path(out) / "preload.json", Path(out) / "preload.md"])
