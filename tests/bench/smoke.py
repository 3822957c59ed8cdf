"""Runs a benchmark script in its smoke mode, the way a person runs it, and reads what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SmokeRun:
    stdout: str
    results: dict[str, Any]


def run_smoke(module: str, out: Path, *extra: str, timeout: float = 240) -> SmokeRun:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    completed = subprocess.run(
        [sys.executable, "-m", module, "--smoke", "--out", str(out), *extra],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout, check=False,
    )
    assert completed.returncode == 0, f"{module} --smoke failed ({completed.returncode}):\n{completed.stderr[-4000:]}"
    # allow_nan=False in the writer; parse_constant rejects NaN/Infinity if they ever appear.
    results = json.loads(out.read_text(), parse_constant=_reject_constant)
    return SmokeRun(completed.stdout, results)


def _reject_constant(name: str) -> Any:
    raise AssertionError(f"the results JSON holds {name}, which is not valid JSON")


def table_header(stdout: str) -> list[str]:
    """The cells of the first markdown table's header row in the output."""
    lines = stdout.splitlines()
    for index, line in enumerate(lines[:-1]):
        if line.startswith("| ") and lines[index + 1].startswith("|---"):
            return [cell.strip() for cell in line.strip("|").split("|")]
    raise AssertionError(f"no markdown table in the output:\n{stdout}")
