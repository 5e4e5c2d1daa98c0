"""Benchmark plots (matplotlib with the file-only Agg backend, imported when a plot is drawn)."""

from __future__ import annotations

import math
from pathlib import Path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finite(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def plot_vs_ratio(rows: list[dict], metric: str, ylabel: str, path: Path, title: str) -> Path:
    """``metric`` against the recompute ratio, one line per method; ratio-free methods as flat lines."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    swept = [r["ratio"] for r in rows if r["ratio"] is not None]
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method and _finite(r[metric])]
        if not mine:
            continue
        if mine[0]["ratio"] is None:
            ax.axhline(mine[0][metric], linestyle="--", linewidth=1.2, label=method, color=_flat_colour(method))
        else:
            ax.plot([r["ratio"] for r in mine], [r[metric] for r in mine], marker="o", label=method)
    if swept:
        ax.set_xlim(min(swept) - 0.02, max(swept) + 0.02)
    ax.set_xlabel("recompute ratio")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, plt, path)


def _flat_colour(method: str) -> str | None:
    return {"full_attention": "black", "full_reuse": "grey"}.get(method)


def plot_ttft(rows: list[dict], path: Path, title: str) -> Path:
    """Median TTFT against the prompt length, one line per method/ratio (log y)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = sorted((r for r in rows if r["label"] == label and _finite(r["ttft_s"])), key=lambda r: r["prompt_tokens"])
        if mine:
            xs, ys = [r["prompt_tokens"] for r in mine], [r["ttft_s"] * 1000 for r in mine]
            ax.plot(xs, ys, marker="o", label=label, color=_flat_colour(label))
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("median TTFT (ms)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, plt, path)


def save_figure(fig, plt, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
