#!/usr/bin/env bash
# GPU training throughput: ResNet-50 at 224x224 on synthetic data, raw PyTorch DDP against
# dtrain's trainer, in bf16-mixed and 16-mixed, one process per GPU (NCCL), images/s per GPU.
# It runs bench.trainer_overhead once per precision, then prints one table with the
# published single-GPU references next to the measured numbers (bench/gpu_report.py).
#
#   bench/gpu_train.sh                      # every visible GPU
#   GPUS=1 STEPS=100 bench/gpu_train.sh     # settings below can be overridden like this
#
# Needs a CUDA GPU; on a machine without one it stops with exit code 3.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
GPUS=${GPUS:-$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')}
BATCH_SIZE=${BATCH_SIZE:-256}          # per GPU, as in NVIDIA's published ResNet-50 runs
STEPS=${STEPS:-200}                    # optimizer steps per run
WARMUP_BATCHES=${WARMUP_BATCHES:-50}   # left out of the steady-state rate (cuDNN autotuning, allocator)
REPETITIONS=${REPETITIONS:-2}          # raw/dtrain pairs per precision
NUM_WORKERS=${NUM_WORKERS:-8}          # data-loader workers per process
OUT_DIR=${OUT_DIR:-bench/results}
PRECISIONS=${PRECISIONS:-"bf16-mixed 16-mixed"}

if [ "$GPUS" -lt 1 ]; then
  echo "gpu_train.sh: no CUDA GPU is visible to PyTorch; run it on a machine with one (or set GPUS)" >&2
  exit 3
fi

mkdir -p "$OUT_DIR"
results=()
for precision in $PRECISIONS; do
  out="$OUT_DIR/gpu_train-$precision.json"
  # One epoch covers the whole run, so no epoch boundary falls inside the timed batches.
  "$PYTHON" -m bench.trainer_overhead \
    --accelerator gpu --processes "$GPUS" \
    --arch resnet50 --image-size 224 --num-classes 1000 \
    --batch-size "$BATCH_SIZE" --precision "$precision" \
    --accumulate-grad-batches 1 --gradient-clip-val 1.0 \
    --steps "$STEPS" --warmup-batches "$WARMUP_BATCHES" \
    --num-samples $((BATCH_SIZE * GPUS * (STEPS + 1))) --num-workers "$NUM_WORKERS" \
    --repetitions "$REPETITIONS" --out "$out"
  results+=("$out")
done
"$PYTHON" -m bench.gpu_report "${results[@]}"
