"""Writing benchmark results: machine description, JSON without NaN, markdown tables, plots.

Plots use matplotlib with the file-only Agg backend, imported when a plot is drawn.

Example:
    >>> print(markdown_table(["method", "F1"], [["fusionrag", fmt(0.51234)]]))
    | method | F1 |
    | --- | --- |
    | fusionrag | 0.512 |
    >>> run_label("fusionrag", 0.15), ratio_cell(None)
    ('fusionrag@0.15', '-')
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Sequence

import torch


def machine_info(rag=None) -> dict[str, Any]:
    """Platform, CPU count, library versions and (with ``rag``) the model, device and dtype."""
    from fusionrag_llm import __version__

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "fusionrag_llm": __version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    if rag is not None:
        model = rag.engine.model
        info.update(model=rag.model_name, device=str(model.device), dtype=str(model.dtype).removeprefix("torch."))
    return info


def machine_line(machine: dict) -> str:
    """The machine as a table's heading says it: platform, CPUs, torch and threads (device and dtype when known)."""
    line = f"{machine['platform']}, {machine['cpu_count']} CPUs, torch {machine['torch']} ({machine['torch_threads']} threads)"
    return line + (f", {machine['device']} {machine.get('dtype')}" if machine.get("device") else "")


def json_safe(value: Any) -> Any:
    """NaN/inf floats become ``None`` (strict JSON has no NaN); tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(path: Path, data: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n")
    return path


def check_ints(config: Any, names: Sequence[str], minimum: int = 1) -> None:
    """``ValueError`` naming the first of ``config``'s fields ``names`` that is not an int >= ``minimum``."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def write_report(out_dir: Path, stem: str, data: Any, markdown: str,
                 plot: Callable[[Path], Path] | None = None) -> list[Path]:  # fmt: skip
    """``stem``.json (``data``), ``stem``.md (``markdown``) and, with ``plot``, ``stem``.png (``plot(path)``
    draws it) in ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    paths = [write_json(out_dir / f"{stem}.json", data), out_dir / f"{stem}.md"]
    paths[1].write_text(markdown)
    return paths if plot is None else [*paths, plot(out_dir / f"{stem}.png")]


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: numbers rounded, ``None``/NaN as ``-``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        text = f"{value:.{digits}f}"
        return text.lstrip("-") if float(text) == 0 else text  # no "-0.000"
    return str(value)


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def ratio_cell(ratio: float | None) -> str:
    """A ratio in a table: ``-`` for a method that does not depend on it."""
    return "-" if ratio is None else f"{ratio:g}"


def run_label(method: str, ratio: float | None) -> str:
    """``method@ratio``, or the method alone when it does not depend on the ratio."""
    return method if ratio is None else f"{method}@{ratio:g}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def mean(values: Sequence[float]) -> float:
    """Mean of the finite values; NaN when there are none."""
    finite = [v for v in values if finite_number(v)]
    return statistics.fmean(finite) if finite else math.nan


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values."""
    if not sorted_values:
        return math.nan
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def finite_number(value: Any) -> bool:
    return value is not None and math.isfinite(value)


@contextmanager
def figure(path: Path, **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """``(figure, axes)`` of ``plt.subplots(**subplots)``, saved to ``path`` (PNG) when the block ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(**subplots)
    try:
        yield fig, axes
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def reference_colour(method: str) -> str | None:
    """The fixed colours of the two baselines in every plot."""
    return {"full_attention": "black", "full_reuse": "grey"}.get(method)
