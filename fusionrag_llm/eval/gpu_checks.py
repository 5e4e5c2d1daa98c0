"""What ``fusionrag bench gpu`` checks besides the engine's own figures: the machine it ran on, the
recompute set's attention (the own query-sparse kernel against FlexAttention and causal SDPA on the
same inputs), decode attention with the keys cut into ranges and whole, several whole-prompt prefills
attended one by one and in one call, and the GPU-marked tests, run in a subprocess."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import subprocess
import sys
import time
import warnings
from collections import Counter
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from fusionrag_llm.eval.results import machine_info
from fusionrag_llm.kernels.dispatch import q_sparse_attention

log = logging.getLogger(__name__)
FRACTIONS = (0.05, 0.15, 0.3)


def _randn(generator: torch.Generator, device, dtype):
    """A maker of random normal tensors of any size, drawn from ``generator`` on the CPU (the same numbers on
    every device), then moved to ``device`` in ``dtype``."""
    return lambda *size: torch.randn(*size, generator=generator).to(device, dtype)


def time_call(fn, device: torch.device, repeats: int) -> float:
    """Seconds of ``fn``: the median of triton's ``do_bench`` on CUDA, else the mean of ``repeats`` calls after one."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=10, rep=100, return_mode="median") / 1e3
    fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats


def attention_rows(model, keys: int, repeats: int) -> list[dict]:
    """The recompute set's attention at FRACTIONS of ``keys`` context keys, on the model's head shape: the
    own query-sparse kernel, FlexAttention with a block mask from the query positions, and causal SDPA of
    every key (what Full Attention pays)."""
    cfg, device, dtype = model.cfg, model.device, model.dtype
    g = torch.Generator().manual_seed(3)
    rnd = _randn(g, device, dtype)
    k, v = rnd(cfg.num_kv_heads, keys, cfg.head_dim), rnd(cfg.num_kv_heads, keys, cfg.head_dim)  # [Hkv, N, D]
    full_q = rnd(1, cfg.num_heads, keys, cfg.head_dim)
    full_k, full_v = (x.repeat_interleave(cfg.num_heads // cfg.num_kv_heads, 0)[None] for x in (k, v))
    flash_s = time_call(lambda: F.scaled_dot_product_attention(full_q, full_k, full_v, is_causal=True), device, repeats)
    positions, rows = torch.arange(keys, device=device), []
    for fraction in FRACTIONS:
        q_positions = torch.randperm(keys, generator=g)[: max(1, round(fraction * keys))].sort().values.to(device)
        q = rnd(cfg.num_heads, len(q_positions), cfg.head_dim)  # [Hq, Nq, D]
        own = partial(q_sparse_attention, q, q_positions, k, v, positions, None, backend=model.kernels)
        own_s = time_call(own, device, repeats)
        rows.append({"fraction": fraction, "keys": keys, "queries": len(q_positions), "own_ms": own_s * 1e3,
                     "causal_sdpa_ms": flash_s * 1e3, **flex_timing(q, q_positions, k, v, own, repeats)})  # fmt: skip
    return rows


def decode_attention_rows(model, longest: int, repeats: int) -> list[dict]:
    """One decode token's attention per request over its own span of keys (one pool), in one call: the
    keys cut into ranges as ``split_count`` chooses against one program per KV head reading them all, for
    one request at 8k and at ``longest`` keys and 32 requests at 1k, on the model's head shape."""
    from fusionrag_llm.kernels.dispatch import q_sparse_attention_spans
    from fusionrag_llm.kernels.q_sparse_attention import split_count

    cfg, device, dtype = model.cfg, model.device, model.dtype
    g, rows = torch.Generator().manual_seed(4), []
    for requests, keys in sorted({(1, min(8192, longest)), (1, longest), (32, min(1024, longest))}):
        args = decode_span_args(requests, keys, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, device, dtype, g)
        run = {splits: partial(q_sparse_attention_spans, *args, splits=splits, backend=model.kernels) for splits in (None, 1)}
        rows.append({"requests": requests, "keys": keys, "max_abs_diff": (run[None]() - run[1]()).abs().max().item(),
                     "splits": split_count(cfg.num_heads // cfg.num_kv_heads, cfg.num_kv_heads, requests, device)
                     if model.kernels == "triton" else 1,
                     "split_ms": time_call(run[None], device, repeats) * 1e3,
                     "whole_ms": time_call(run[1], device, repeats) * 1e3})  # fmt: skip
    return rows


def prefill_attention_rows(model, longest: int, repeats: int) -> list[dict]:
    """Whole-prompt prefills of several requests at once (each a causal block over its own keys, as Full
    Attention's prefills and entry computations are): attended one request at a time through PyTorch's
    fused causal attention (``attend_causal_block``, what the Triton backend does now) against all of them
    in one call of the own kernel over one buffer (``q_sparse_attention_spans``, what a step's pooled
    sequences get), for 8 and 32 requests of 1k tokens and 4 of 4k, on the model's head shape."""
    from fusionrag_llm.kernels.dispatch import q_sparse_attention_spans
    from fusionrag_llm.models.attention import attend_causal_block

    cfg, device, dtype = model.cfg, model.device, model.dtype
    rnd, rows = _randn(torch.Generator().manual_seed(5), device, dtype), []
    for requests, tokens in sorted({(8, min(1024, longest)), (32, min(1024, longest)), (4, min(4096, longest))}):
        q = rnd(cfg.num_heads, requests * tokens, cfg.head_dim)
        k, v = rnd(cfg.num_kv_heads, requests * tokens, cfg.head_dim), rnd(cfg.num_kv_heads, requests * tokens, cfg.head_dim)
        positions = torch.arange(tokens, device=device).repeat(requests)
        offsets = torch.arange(0, requests * tokens + 1, tokens, device=device)

        spans = [(start, start + tokens) for start in range(0, requests * tokens, tokens)]

        def each():
            return torch.cat([attend_causal_block(q[:, a:b], k[:, a:b], v[:, a:b], 0) for a, b in spans], dim=1)

        def one():
            return q_sparse_attention_spans(q, positions, offsets, k, v, positions, None, offsets[:-1], offsets[1:],
                                            tokens, backend=model.kernels)  # fmt: skip

        rows.append({"requests": requests, "tokens": tokens, "max_abs_diff": (each() - one()).abs().max().item(),
                     "each_ms": time_call(each, device, repeats) * 1e3, "one_call_ms": time_call(one, device, repeats) * 1e3})
    return rows


def decode_span_args(requests: int, keys: int, heads: int, kv_heads: int, head_dim: int, device, dtype,
                     generator: torch.Generator) -> tuple:
    """Random arguments of ``q_sparse_attention_spans`` for one decode token per request: request b's query
    at position ``keys`` over its own span of ``keys`` keys (positions 0..keys-1) in one buffer."""
    rnd = _randn(generator, device, dtype)
    q, k, v = rnd(heads, requests, head_dim), rnd(kv_heads, requests * keys, head_dim), rnd(kv_heads, requests * keys, head_dim)
    starts = torch.arange(0, requests * keys, keys, device=device)
    return (q, torch.full((requests,), keys, device=device), torch.arange(requests + 1, device=device), k, v,
            torch.arange(keys, device=device).repeat(requests), None, starts, starts + keys, 1)  # fmt: skip


def flex_timing(q, q_positions, k, v, own, repeats: int) -> dict:
    """FlexAttention (compiled on CUDA, eager elsewhere) on the same inputs, and its max difference to ``own``."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cuda = q.device.type == "cuda"
    try:
        mask = create_block_mask(lambda b, h, qi, ki: q_positions[qi] >= ki, None, None, q.shape[1], k.shape[1],
                                 device=q.device)  # fmt: skip
        flex = torch.compile(flex_attention) if cuda else flex_attention

        def call():
            return flex(q[None], k[None], v[None], block_mask=mask, enable_gqa=True)[0]

        with warnings.catch_warnings():  # eager FlexAttention warns that it materialises the scores
            warnings.simplefilter("ignore", UserWarning)
            diff = (call().float() - own().float()).abs().max().item()
            seconds = time_call(call, q.device, repeats)
    except Exception as exc:  # a compile or memory failure costs this row, not the run
        log.warning("FlexAttention failed: %s", exc)
        return {"flex": f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    return {"flex": "compiled" if cuda else "eager (compiled needs CUDA)", "flex_ms": seconds * 1e3,
            "max_abs_diff": diff}  # fmt: skip


def tests_folder() -> Path | None:
    """The checkout's ``tests`` folder: next to the package when it runs from a checkout, else in the
    current folder when that is a checkout (the package installed elsewhere, e.g. on a machine without
    a package index)."""
    import fusionrag_llm

    for checkout in (Path(fusionrag_llm.__file__).resolve().parents[1], Path.cwd()):
        if (checkout / "pyproject.toml").is_file() and (checkout / "tests").is_dir():
            return checkout / "tests"
    return None


def run_gpu_tests(folder: Path, timeout: float) -> dict:
    """``pytest -m gpu`` on ``folder`` in a subprocess: counts and failing test ids, read from the verbose
    lines as they come (so a run cut short by ``timeout`` still counts what finished). A test module that
    cannot be imported (an optional package missing) is listed in ``uncollected``, and the others run;
    the checkout's folder is not put on the import path, so an installed package is the one tested."""
    command = [sys.executable, "-m", "pytest", "-v", "-m", "gpu", "-p", "no:cacheprovider",
               "--continue-on-collection-errors", str(folder)]  # fmt: skip
    started = time.perf_counter()
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    try:
        done = subprocess.run(command, cwd=folder.parent, capture_output=True, text=True, timeout=timeout, env=env)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        output, code = "".join(o.decode() if isinstance(o, bytes) else o or "" for o in (exc.stdout, exc.stderr)), None
    outcomes = re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", output, re.MULTILINE)
    found = Counter(outcome.lower() for _, outcome in outcomes)
    counts = {word: found[word] for word in ("passed", "failed", "error", "skipped")}
    uncollected = sorted(set(re.findall(r"^ERROR (\S+\.py)\b(?!::)", output, re.MULTILINE)))
    return {"command": " ".join(command[1:]), "returncode": code, "timed_out": code is None, **counts,
            "uncollected": uncollected, "seconds": time.perf_counter() - started, "output_tail": output[-3000:],
            "failing": [test for test, outcome in outcomes if outcome in ("FAILED", "ERROR")]}  # fmt: skip


def header(device: str) -> dict:
    """The machine: device name, driver, torch, Triton and CUDA versions."""
    info = machine_info() | {"device": "cpu", "driver": "unknown", "cuda_version": torch.version.cuda}
    try:
        info["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        info["triton"] = "not installed"
    if device.startswith("cuda"):
        from fusionrag_llm.kernels.q_sparse_attention import launch_config

        props, cuda = torch.cuda.get_device_properties(device), torch.device(device)
        info.update(device=props.name, memory_gib=round(props.total_memory / (1 << 30), 1), driver=_driver(),
                    capability=f"{props.major}.{props.minor}",
                    shared_memory_kib=getattr(props, "shared_memory_per_block_optin", 0) / 1024,
                    # the attention tiles for this card's shared memory: decode-sized and prefill-sized calls
                    tiles={rows: launch_config(rows, 2, 128, cuda) for rows in (4, 512)})  # fmt: skip
    return info


def _driver() -> str:
    try:
        query = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):  # no nvidia-smi
        return "unknown"
    return (query.stdout.split() or ["unknown"])[0]
