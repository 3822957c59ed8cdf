"""`dtrain validate` on hostile files: CPU time against file size, to show the answer stays linear.

    .venv/bin/python -m bench.validate_scale            # 1,000 / 10,000 / 50,000 entries (under the 3 MiB file cap)
    .venv/bin/python -m bench.validate_scale --smoke    # 100 / 1,000: seconds, for the tests

Two shapes of input a hostile or careless user writes: thousands of unknown keys under `spec`
(each one gets a "did you mean" lookup, which must not compare every key with every other) and a
long `env` list (each entry checked against the reserved names). For each size it runs the CLI
in-process, as `dtrain validate FILE` does, and reads the process CPU time. The ratio column is
CPU per entry against the smallest size's: near 1 means linear; a quadratic check would grow
with the size. Target: the largest size's ratio <= 2, and 10,000 unknown keys under 1 s.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, markdown_table, write_results
from dtrain_operator.cli import main as cli

HEAD = """\
apiVersion: dtrain.dev/v1alpha1
kind: DistributedTraining
metadata:
  name: job
spec:
  accelerator: cpu
"""

SHAPES = {
    "unknown keys under spec": lambda n: "".join(f"  unknownField{i}: {i}\n" for i in range(n)),
    "env entries": lambda n: "  env:\n" + "".join(f"    - name: VAR_{i}\n      value: v\n" for i in range(n)),
}


def cpu_seconds_to_validate(path: Path, repetitions: int) -> float:
    """The smallest CPU time of `repetitions` runs of `dtrain validate path` (its output discarded)."""
    best = float("inf")
    for _ in range(repetitions):
        started = time.process_time()
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            cli.main(["validate", str(path)])
        best = min(best, time.process_time() - started)
    return best


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.validate_scale", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes: seconds, for the tests")
    parser.add_argument("--sizes", default=None, help="comma-separated entry counts (default 1000,10000,50000)")
    parser.add_argument("--repetitions", type=int, default=3, help="runs per size; the fastest counts")
    parser.add_argument("--out", default=None, help="results JSON (default bench/results/validate_scale.json)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in (args.sizes or ("100,1000" if args.smoke else "1000,10000,50000")).split(",")]
    rows, cases = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for shape, spec_of in SHAPES.items():
            base_per_entry = None
            for size in sizes:
                path = Path(tmp) / "job.yaml"
                path.write_text(HEAD + spec_of(size))
                seconds = cpu_seconds_to_validate(path, args.repetitions)
                per_entry = seconds / size
                base_per_entry = base_per_entry or per_entry
                ratio = per_entry / base_per_entry
                rows.append((shape, f"{size:,}", f"{path.stat().st_size / 1e6:.2f}", seconds, per_entry * 1e6, ratio))
                cases.append({"shape": shape, "entries": size, "cpu_seconds": seconds, "per_entry_ratio": ratio})
    print(markdown_table(["input", "entries", "file MB", "CPU s", "CPU µs per entry", "per entry / smallest"], rows))
    path = write_results("validate_scale", {"benchmark": "validate_scale", "machine": machine(), "cases": cases}, args.out)
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
