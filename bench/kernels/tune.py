"""Launch-configuration sweep of the query-sparse attention kernel: check and time each tile shape.

    python bench/kernels/tune.py [--out DIR] [--variants q_sparse_attention,...] [--budget-s 240]
    python bench/kernels/tune.py --variants OLD,NEW --defaults-only   # two versions as they ship
    python bench/kernels/tune.py --dry-run    # list the cases and configurations only
    python bench/kernels/tune.py --small      # CPU smoke run (Triton interpreter)

Cases (``cases``): speed.py's FusionRAG prefill layout at its recompute fractions (32k context,
32 query / 8 KV heads, head dim 128, bf16), a small recompute set (16 queries: 64 rows) and
decode (one query at the end of the context, one context key invalid). A *variant* is
a module of ``fusionrag_llm.kernels`` with the ``q_sparse_attention`` launcher (by default the
shipped one); each configuration (BLOCK_M, BLOCK_N, num_warps, num_stages) replaces the module's
``launch_config`` for its calls, ``default`` keeps the module's choice.

Every (variant, configuration, case) is first checked against ``q_sparse_attention_ref`` (fp32, on
the same fresh random inputs, the output buffer poisoned with NaN first): relative error
``|out - ref| / |ref|`` at most ``--tolerance`` and no NaN, else the row is marked failed and not
timed. Times are medians of ``triton.testing.do_bench``; TFLOP/s count the visible query-key pairs
(as speed.py), ``vs full`` is causal SDPA over the whole context (timed once in the same run)
divided by the kernel's time. The table printed last gives, per case, the first variant's default
against the fastest correct configuration of the last variant.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

import torch

from speed import FRACTIONS, FULL, SMALL, build_inputs, causal_sdpa, time_call, visible_pairs

Config = tuple[int, int, int, int]  # BLOCK_M, BLOCK_N, num_warps, num_stages

# configurations per row bucket: many rows (prefill recompute sets), one row block, decode
GRID_ROWS = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2), (64, 128, 4, 3), (128, 32, 8, 3), (128, 64, 8, 2),
             (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2)]  # fmt: skip
GRID_BLOCK = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 3), (32, 64, 4, 3), (32, 128, 4, 3), (16, 64, 4, 3),
              (16, 128, 4, 3)]  # fmt: skip
GRID_DECODE = [(16, 64, 4, 2), (16, 64, 4, 3), (16, 64, 4, 4), (16, 128, 4, 2), (16, 128, 4, 3), (16, 128, 8, 3)]
# the baseline variant (the first of several) runs its default and these only
GRID_BASELINE = [(128, 64, 8, 2)]
SMALL_GRID = [(16, 16, 4, 2), (32, 16, 4, 2)]

# the CI smoke run (tests/bench/test_lab_scripts.py adds --out)
TINY_ARGS = ["--small", "--context", "40", "--fractions", "0.3", "--defaults-only"]

def cases(shape: dict, fractions, small: bool) -> list[dict]:
    """The tuned cases: name, recompute fraction or query count, decode or not, configuration grid."""
    grid = (lambda g: SMALL_GRID) if small else (lambda g: g)
    out = [{"name": f"prefill f={f:g}", "fraction": f, "grid": grid(GRID_ROWS)} for f in fractions]
    out.append({"name": "16 queries", "queries": 16, "grid": grid(GRID_BLOCK)})
    out.append({"name": "decode", "queries": 1, "decode": True, "grid": grid(GRID_DECODE)})
    return out


def case_inputs(shape: dict, case: dict, device: str, seed: int) -> dict:
    """speed.py's layout (sorted random recompute positions over the context); decode: the last position,
    the recompute position's context entry invalid."""
    n = shape["context"]
    fraction = case.get("fraction", case.get("queries", 1) / n)
    inp = build_inputs(shape, fraction, device, seed=seed)
    if case.get("decode"):
        inp["k_valid"][inp["q_positions"]] = False
        inp["q_positions"] = torch.full_like(inp["q_positions"], n - 1)
    return inp


def _as_dict(cfg: Config) -> dict:
    return {"BLOCK_M": cfg[0], "BLOCK_N": cfg[1], "num_warps": cfg[2], "num_stages": cfg[3]}


def _as_tuple(cfg: dict) -> Config:
    return (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg.get("num_warps", 4), cfg.get("num_stages", 2))


def default_config(module, inp: dict) -> Config:
    """The configuration the module's own ``launch_config`` picks for these inputs."""
    rows = inp["q"].shape[1] * (inp["q"].shape[0] // inp["k"].shape[0])
    return _as_tuple(module.launch_config(rows, inp["q"].element_size()))


def run_config(module, cfg: Config | None, inp: dict, ref: torch.Tensor, device: str, reps: int,
               tolerance: float) -> dict:
    """Check one configuration against the reference, then time it; a failure is recorded, not raised."""
    own = module.launch_config
    used = default_config(module, inp) if cfg is None else cfg
    args = [inp[k] for k in ("q", "q_positions", "k", "v", "k_positions", "k_valid")]
    row = {"config": list(used), "default": cfg is None}
    if cfg is not None:
        module.launch_config = lambda rows_max, itemsize=2, head_dim=128, device=None: _as_dict(cfg)
    try:
        torch.full_like(inp["q"], float("nan"))  # freed at once: the output buffer reuses this NaN block
        out = module.q_sparse_attention(*args).float()
        if device == "cuda":
            torch.cuda.synchronize()
        rel = ((out - ref).norm() / ref.norm()).item()
        row.update(rel_err=rel, max_abs_diff=(out - ref).abs().max().item(), finite=bool(out.isfinite().all()))
        row["ok"] = row["finite"] and rel <= tolerance
        if row["ok"]:
            row["ms"] = time_call(lambda: module.q_sparse_attention(*args), device, reps) * 1e3
    except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory for this tile shape
        row.update(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    finally:
        module.launch_config = own
    return row


def best(rows: list[dict], case: str, variant: str) -> dict | None:
    """The fastest correct row of one case and variant (None if none)."""
    ok = [r for r in rows if r["case"] == case and r["variant"] == variant and r.get("ok") and "ms" in r]
    return min(ok, key=lambda r: r["ms"]) if ok else None


def run(shape: dict, case_list: list[dict], variants: list[str], device: str, reps: int, tolerance: float,
        budget_s: float, seed: int, on_row=None, grid: bool = True) -> dict:
    """Every (case, variant, configuration) row; rows past the time budget are recorded as skipped.

    ``grid=False`` runs each variant's default configuration only.
    """
    from fusionrag_llm.kernels.q_sparse_attention import q_sparse_attention_ref

    t0 = time.perf_counter()
    modules = {v: importlib.import_module(f"fusionrag_llm.kernels.{v}") for v in variants}
    t_full = time_call(causal_sdpa(shape, device), device, reps) if device == "cuda" else None
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (triton interpreter)",
              "torch": torch.__version__, "triton": _triton_version(), "shape": shape, "variants": variants,
              "tolerance": tolerance, "seed": seed, "causal_full_ms": None if t_full is None else t_full * 1e3,
              "rows": []}  # fmt: skip
    for case in case_list:
        inp = case_inputs(shape, case, device, seed)
        args = [inp[k] for k in ("q", "q_positions", "k", "v", "k_positions", "k_valid")]
        ref = q_sparse_attention_ref(*args).float()
        flops = 4 * inp["q"].shape[2] * inp["q"].shape[0] * visible_pairs(inp)
        for i, variant in enumerate(variants):
            configs = (GRID_BASELINE if len(variants) > 1 and i == 0 else case["grid"]) if grid else []
            default = default_config(modules[variant], inp)
            for cfg in [None, *(c for c in configs if c != default)]:
                row = {"case": case["name"], "variant": variant, "queries": inp["q"].shape[1], "flops": flops}
                if time.perf_counter() - t0 > budget_s:
                    row.update(config=list(cfg or default), default=cfg is None, ok=False,
                               error="skipped: time budget")
                else:
                    row.update(run_config(modules[variant], cfg, inp, ref, device, reps, tolerance))
                if row.get("ms"):
                    row["tflops"] = flops / row["ms"] / 1e9
                    row["vs_full"] = None if t_full is None else t_full * 1e3 / row["ms"]
                result["rows"].append(row)
                if on_row:
                    on_row(result, row)
        del inp, ref
    result["elapsed_s"] = time.perf_counter() - t0
    return result


def _triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except Exception:  # noqa: BLE001
        return None


def _fmt(x, spec: str) -> str:
    return format(x, spec) if x is not None else "-"


def _cfg(row: dict | None) -> str:
    if row is None or row.get("config") is None:
        return "-"
    return "x".join(map(str, row["config"][:2])) + f" w{row['config'][2]} s{row['config'][3]}"


def format_rows(result: dict) -> str:
    """Every row: case, variant, configuration, ms, TFLOP/s, vs full, relative error."""
    head = f"{'case':<16} {'variant':<28} {'config':<16} {'ms':>9} {'TFLOP/s':>8} {'vs full':>8} {'rel err':>8}"
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        lines.append(f"{r['case']:<16} {r['variant']:<28} {_cfg(r) + ('*' if r.get('default') else ''):<16} "
                     f"{_fmt(r.get('ms'), '>9.3f')} {_fmt(r.get('tflops'), '>8.1f')} "
                     f"{_fmt(r.get('vs_full'), '>7.2f')}x {_fmt(r.get('rel_err'), '>8.1e')}"
                     + (f"  ({r['error']})" if r.get("error") else "") + ("  FAILED" if not r.get("ok") else ""))
    return "\n".join(lines)


def format_summary(result: dict) -> str:
    """Per case: the first variant's default against the last variant's fastest correct row."""
    first, last = result["variants"][0], result["variants"][-1]
    head = (f"{'case':<16} {'before config':<16} {'ms':>9} {'TFLOP/s':>8} {'vs full':>8} | "
            f"{'best config':<16} {'ms':>9} {'TFLOP/s':>8} {'vs full':>8} {'rel err':>8} {'speedup':>8}")
    title = (f"device: {result['device']}  torch {result['torch']}  triton {result['triton']}  "
             f"causal full: {_fmt(result['causal_full_ms'], '.3f')} ms  before: {first} (default)  best: {last}")
    lines = [title, head, "-" * len(head)]
    for name in dict.fromkeys(r["case"] for r in result["rows"]):
        before = next((r for r in result["rows"] if r["case"] == name and r["variant"] == first
                       and r.get("default")), None)  # fmt: skip
        after = best(result["rows"], name, last)
        gain = before["ms"] / after["ms"] if before and after and before.get("ms") else None
        lines.append(f"{name:<16} {_cfg(before):<16} {_fmt(before and before.get('ms'), '>9.3f')} "
                     f"{_fmt(before and before.get('tflops'), '>8.1f')} {_fmt(before and before.get('vs_full'), '>7.2f')}x | "
                     f"{_cfg(after):<16} {_fmt(after and after['ms'], '>9.3f')} {_fmt(after and after['tflops'], '>8.1f')} "
                     f"{_fmt(after and after.get('vs_full'), '>7.2f')}x {_fmt(after and after['rel_err'], '>8.1e')} "
                     f"{_fmt(gain, '>7.2f')}x")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python bench/kernels/tune.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_out", help="folder for tune.json")
    p.add_argument("--variants", default="q_sparse_attention",
                   help="comma-separated modules of fusionrag_llm.kernels; the first is the baseline")
    p.add_argument("--fractions", default=",".join(map(str, FRACTIONS)), help="comma-separated")
    p.add_argument("--context", type=int, help="context length (default 32768, or 96 with --small)")
    p.add_argument("--reps", type=int, default=None, help="do_bench time in ms (default 100, 1 rep with --small)")
    p.add_argument("--tolerance", type=float, default=None, help="relative error bound (bf16 1e-2, fp32 1e-4)")
    p.add_argument("--budget-s", type=float, default=240.0, help="rows past this many seconds are skipped")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--small", action="store_true", help="tiny sizes; allowed on CPU (smoke run)")
    p.add_argument("--defaults-only", action="store_true", help="each variant's own configuration only")
    p.add_argument("--dry-run", action="store_true", help="list the cases and configurations and exit")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Run the sweep; returns a process exit code (2 when refused)."""
    args = parse_args(argv)
    shape = dict(SMALL if args.small else FULL)
    if args.context:
        shape["context"] = args.context
    variants = args.variants.split(",")
    case_list = cases(shape, [float(f) for f in args.fractions.split(",")], args.small)
    if args.dry_run:
        for case in case_list:
            sys.stdout.write(f"{case['name']}: default, " + ", ".join(map(str, case["grid"])) + "\n")
        sys.stdout.write(f"variants: {variants} (a first of several runs default, {GRID_BASELINE})\n")
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.small:
        sys.stderr.write("tune.py: no CUDA device; the sweep needs a GPU (use --small for a CPU smoke run)\n")
        return 2
    out = Path(args.out) / "tune.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def on_row(result, row):
        out.write_text(json.dumps(result, indent=2))
        sys.stdout.write(format_rows({"rows": [row]}).splitlines()[-1] + "\n")
        sys.stdout.flush()

    tolerance = args.tolerance or (1e-4 if shape["dtype"] == "float32" else 1e-2)
    reps = args.reps or (1 if args.small else 100)
    result = run(shape, case_list, variants, device, reps, tolerance, args.budget_s, args.seed, on_row,
                 grid=not args.defaults_only)
    out.write_text(json.dumps(result, indent=2))
    sys.stdout.write(format_rows(result) + "\n\n" + format_summary(result) + f"\nwrote {out}\n")
    return 0


if __name__ == "__main__":
    if not torch.cuda.is_available() and "--small" in sys.argv and os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, __file__, *sys.argv[1:]])
    sys.exit(main(sys.argv[1:]))
