"""What every benchmark shares: statistics, the markdown table, the JSON results file."""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and the relative half-range of a small sample (repetitions of one measurement)."""
    median = statistics.median(values)
    return {
        "median": median,
        "min": min(values),
        "max": max(values),
        "half_range_pct": 100.0 * (max(values) - min(values)) / 2.0 / median if median else 0.0,
    }


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub markdown table; floats are printed with 3 significant digits or as integers when large."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(format_cell(value) for value in row) + " |")
    return "\n".join(lines)


def format_cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


def machine() -> dict[str, Any]:
    """Where the numbers were taken, including how busy the machine was when the run began."""
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_average_at_start": list(os.getloadavg()),
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    return info


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def write_results(name: str, results: dict[str, Any], out: str | os.PathLike[str] | None) -> Path:
    """Write results as JSON to `out`, or to bench/results/<name>.json; returns the path."""
    path = Path(out) if out is not None else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_at_end": load_average(),
        **results,
    }
    path.write_text(json.dumps(json_safe(document), indent=2, allow_nan=False) + "\n")
    return path


def json_safe(value: Any) -> Any:
    """NaN and infinity (a measurement that was not taken) become null, which JSON can hold."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value

