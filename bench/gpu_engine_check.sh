#!/usr/bin/env bash
# TensorRT engines for ResNet-50 (224x224, random weights) at fp32 and fp16 with
# `dtrain build-engine`: each engine is checked against ONNX Runtime and the PyTorch model on
# random batches and timed next to PyTorch eager on the same GPU. Prints one table from the
# two reports. Then builds the engine cases of bench/engine_cases.py (Q/DQ at fp16 and int8,
# fp32 without TF32, a dynamic sequence axis, two inputs, a data-dependent output, a plugin
# op) with the flags the test suite runs them with on its TensorRT double, and checks each
# report's plan against the case's expectations. Not part of `make test`: it needs a CUDA GPU
# and TensorRT 10 (the engine image, trainer_image/engine.Dockerfile, has both).
#
#   bench/gpu_engine_check.sh
#   MAX_BATCH=256 PRECISIONS="fp16" bench/gpu_engine_check.sh     # settings below can be overridden
#
# Exit codes: 0 every engine passed its accuracy check, 1 one failed, 3 no GPU or no TensorRT.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
ARCH=${ARCH:-resnet50}
MIN_BATCH=${MIN_BATCH:-1}
OPT_BATCH=${OPT_BATCH:-32}
MAX_BATCH=${MAX_BATCH:-128}
PRECISIONS=${PRECISIONS:-"fp32 fp16"}
ITERATIONS=${ITERATIONS:-200}
MAX_SECONDS=${MAX_SECONDS:-20}
OUT_DIR=${OUT_DIR:-bench/results/engine}

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_engine_check.sh: no CUDA GPU is visible to PyTorch; run it on a machine with one" >&2
  exit 3
fi
if ! "$PYTHON" -c 'import sys, tensorrt; sys.exit(0 if hasattr(tensorrt, "Builder") else 1)' 2>/dev/null; then
  echo "gpu_engine_check.sh: TensorRT is not installed; run it in the engine image (trainer_image/engine.Dockerfile)" >&2
  exit 3
fi

mkdir -p "$OUT_DIR"
# model.onnx, a checkpoint and artifacts.json, as training leaves them in artifacts.dir.
ARCH="$ARCH" OUT_DIR="$OUT_DIR" "$PYTHON" - <<'PY'
import json, os
from pathlib import Path

import torch

from dtrain_operator import contract
from dtrain_trainer.export import export_onnx
from dtrain_trainer.models import ImageClassifier

out = Path(os.environ["OUT_DIR"])
arch = os.environ["ARCH"]
torch.manual_seed(0)
model = ImageClassifier(arch=arch, num_classes=1000).eval()
export_onnx(model, (3, 224, 224), out / contract.ONNX_FILE_NAME, opset=17, dynamic_batch=True)
torch.save({"state_dict": model.state_dict()}, out / "last.ckpt")
(out / contract.ARTIFACTS_FILE_NAME).write_text(json.dumps({
    contract.ARTIFACTS_KEY_CHECKPOINT: "last.ckpt",
    contract.ARTIFACTS_KEY_MODEL: {"classPath": "dtrain_trainer.models.ImageClassifier", "initArgs": {"arch": arch}},
}))
print(f"exported {arch} to {out / contract.ONNX_FILE_NAME}")
PY

status=0
reports=()
for precision in $PRECISIONS; do
  report="$OUT_DIR/engine-report-$precision.json"
  echo "== $ARCH $precision"
  "$PYTHON" -m dtrain_operator.cli build-engine \
    --onnx "$OUT_DIR/model.onnx" --out "$OUT_DIR/model-$precision.plan" --precision "$precision" \
    --min-batch "$MIN_BATCH" --opt-batch "$OPT_BATCH" --max-batch "$MAX_BATCH" \
    --timing-cache "$OUT_DIR/timing.cache" --report "$report" \
    --iterations "$ITERATIONS" --max-seconds "$MAX_SECONDS" || status=$?
  reports+=("$report")
done

"$PYTHON" - "${reports[@]}" <<'PY'
import json, sys

print()
print(f"{'precision':<9} {'batch':>5} {'TRT ms':>8} {'p99 ms':>8} {'images/s':>10} {'PyTorch ms':>10} {'speed-up':>8} "
      f"{'max rel err':>11} {'bound':>6} {'build s':>7}  device")
for path in sys.argv[1:]:
    try:
        report = json.load(open(path))
    except (OSError, ValueError):
        print(f"{path}: no report")
        continue
    errors = {}
    for c in report["accuracy"]["comparisons"]:
        value = c["max_relative_error"] if c["max_relative_error"] is not None else float("inf")
        errors[c["batch_size"]] = max(errors.get(c["batch_size"], 0.0), value)
    build = (report.get("tensorrt") or {}).get("build_seconds")
    for row in report["latency"]:
        pytorch = row["pytorch"]["median_ms"] if row["pytorch"] else float("nan")
        speedup = row["speedup_vs_pytorch"] or float("nan")
        print(f"{report['precision']['requested']:<9} {row['batch_size']:>5} {row['median_ms']:>8.3f} {row['p99_ms']:>8.3f} "
              f"{row['images_per_second']:>10.1f} {pytorch:>10.3f} {speedup:>7.2f}x {errors.get(row['batch_size'], float('nan')):>11.2e} "
              f"{report['accuracy']['bound']:>6g} {build if build is not None else '-':>7}  {report['device']}")
    if not report["passed"]:
        print(f"  {report['precision']['requested']}: accuracy check FAILED (engine not written)")
PY

echo
echo "== engine cases (bench/engine_cases.py) on the real TensorRT"
OUT_DIR="$OUT_DIR" "$PYTHON" - <<'PY' || status=$?
import json, os, subprocess, sys
from pathlib import Path

from bench.engine_cases import CASES

out = Path(os.environ["OUT_DIR"]) / "cases"
out.mkdir(parents=True, exist_ok=True)
failed = []
for case in CASES:
    onnx_path = case.write(out / f"{case.name}.onnx")
    report_path = out / f"{case.name}-report.json"
    command = [sys.executable, "-m", "dtrain_operator.cli", "build-engine", "--onnx", str(onnx_path),
               "--out", str(out / f"{case.name}.plan"), "--report", str(report_path), "--use-cuda-graph", *case.flags]
    code = subprocess.run(command, capture_output=True, text=True)
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    problems = [] if code.returncode == 0 else [f"exit {code.returncode}: {code.stderr.strip()[-300:]}"]
    version = tuple(int(p) for p in report["plan"]["tensorrt"]["version"].split(".")[:2]) if report else (0, 0)
    if report is not None and (10, 12) <= version < (11, 0):  # the expectations are the 10.13 plan's
        for dotted, expected in case.expect:
            value = report["plan"]
            for part in dotted.split("."):
                value = value[part]
            if value != expected:
                problems.append(f"{dotted} = {value!r}, expected {expected!r}")
    rows = report["latency"] if report else []
    first = rows[0] if rows else {}
    print(f"{case.name:<24} {'ok' if not problems else 'FAILED':<7} GPU median {first.get('median_ms', float('nan')):.3f} ms"
          f"  layers {((report or {}).get('tensorrt') or {}).get('layers', {}).get('layers_by_output_type')}")
    for problem in problems:
        print(f"    {problem}")
    failed += [case.name] if problems else []
sys.exit(1 if failed else 0)
PY
exit "$status"
