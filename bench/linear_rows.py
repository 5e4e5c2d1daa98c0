"""CPU linear layers by input rows: what the model's layers run (the packed oneDNN multiply up to the
row limit of ``packed_max_rows``, else ``F.linear``) against ``F.linear`` on the same inputs.

    python bench/linear_rows.py [--model smollm2-135m] [--rows 16,64,128,512,2048] [--layers 8] [--repeats 10] [--out DIR]

For each row count: milliseconds to multiply one input through every linear layer of the first
``--layers`` decoder layers in turn (q, k, v, o, gate, up, down: as a forward reads them, each
weight from memory, not from the cache a single repeated call would leave it in), each way, as
medians of ``--repeats`` interleaved runs; their ratio; the largest difference between the results.
Decode steps are a row or a few; a sparse prefill of a ~1.2k-token prompt at r = 0.15 is ~120 rows,
Full Attention's a row per token. The header names the processor's vendor and the row limit it
gets. Writes linear_rows.json and linear_rows.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fusionrag_llm.eval.results import fmt, machine_info, markdown_table, write_report
from fusionrag_llm.models.linear import Linear, cpu_vendor, packed_max_rows
from fusionrag_llm.models.loader import load_model

TINY_ARGS = ["--model", "tiny", "--rows", "4,80", "--layers", "1", "--repeats", "2"]


def linears(model, layers: int) -> list[Linear]:
    """The linear layers of the first ``layers`` decoder layers, in the order a forward runs them."""
    return [module for block in model.model.layers[:layers] for module in block.modules() if isinstance(module, Linear)]


def time_rows(layers: list[Linear], rows: int, repeats: int) -> dict:
    inputs = {n: torch.randn(rows, n, generator=torch.Generator().manual_seed(n)) for n in {m.in_features for m in layers}}
    runs = {"f_linear": lambda: [F.linear(inputs[m.in_features], m.weight, m.bias) for m in layers],
            "layer": lambda: [m(inputs[m.in_features]) for m in layers]}  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.inference_mode():
        for run in runs.values():
            run()  # warm-up
        for _ in range(repeats):
            for name, run in runs.items():  # interleaved, so drift hits both alike
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        diff = max((a - b).abs().max().item() for a, b in zip(runs["layer"](), runs["f_linear"]()))
    f_ms, layer_ms = (statistics.median(times[name]) * 1e3 for name in runs)
    flops = 2 * rows * sum(m.in_features * m.out_features for m in layers)
    return {"rows": rows, "f_linear_ms": f_ms, "layer_ms": layer_ms, "speedup": f_ms / layer_ms,
            "f_linear_gflops": flops / f_ms / 1e6, "layer_gflops": flops / layer_ms / 1e6, "max_abs_diff": diff}  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rows", default="16,64,128,512,2048", help="input rows, comma-separated")
    p.add_argument("--layers", type=int, default=8, help="decoder layers whose linear layers are timed")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default="bench_results")
    args = p.parse_args(argv)
    model = load_model(args.model, device="cpu", dtype="float32").model
    rows = [int(r) for r in args.rows.split(",")]
    layers = linears(model, args.layers)
    table = [time_rows(layers, n, args.repeats) for n in rows]
    limit = packed_max_rows()
    header = {"machine": machine_info(), "vendor": cpu_vendor(), "packed_max_rows": None if limit == float("inf") else limit,
              "model": args.model, "layers": args.layers, "linears": len(layers), "repeats": args.repeats}  # fmt: skip
    lines = [f"# CPU linear layers by rows: {args.model}", "",
             f"{header['machine']['platform']}, {header['machine']['cpu_count']} CPUs, vendor {header['vendor'] or 'unknown'}, "
             f"torch {torch.__version__} ({torch.get_num_threads()} threads); the layers' packed multiply serves "
             f"{'every row count' if header['packed_max_rows'] is None else 'up to %d rows' % header['packed_max_rows']}. "
             f"The {len(layers)} linear layers of the first {args.layers} decoder layers in turn; medians of "
             f"{args.repeats}, interleaved.", "",
             markdown_table(["rows", "F.linear ms", "GFLOP/s", "layers ms", "GFLOP/s", "speedup", "max abs diff"],
                            [[r["rows"], fmt(r["f_linear_ms"]), f"{r['f_linear_gflops']:.0f}", fmt(r["layer_ms"]),
                              f"{r['layer_gflops']:.0f}", f"{r['speedup']:.2f}x", f"{r['max_abs_diff']:.1e}"]
                             for r in table])]  # fmt: skip
    paths = write_report(Path(args.out), "linear_rows", {**header, "rows": table}, "\n".join(lines) + "\n")
    print(paths[1].read_text() + "wrote " + ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
