#!/usr/bin/env bash
# TensorRT engines for ResNet-50 (224x224, random weights) at fp32 and fp16 with
# `dtrain build-engine`: each engine is checked against ONNX Runtime and the PyTorch model on
# random batches and timed next to PyTorch eager on the same GPU. Prints one table from the
# two reports. Not part of `make test`: it needs a CUDA GPU and TensorRT 10 (the engine image,
# trainer_image/engine.Dockerfile, has both).
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
exit "$status"
