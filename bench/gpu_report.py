"""The table bench/gpu_train.sh ends with: images/s per GPU, raw DDP against dtrain, next to published references.

    python -m bench.gpu_report bench/results/gpu_train-bf16-mixed.json bench/results/gpu_train-16-mixed.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .common import markdown_table

# NVIDIA Deep Learning Examples, PyTorch ResNet-50 v1.5, "Training performance results"
# (pytorch-21.03 NGC container; ImageNet through DALI, fp16 AMP with channels-last, batch 256 per GPU):
# https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/Classification/ConvNets/resnet50v1.5/README.md
# and the batch size and memory format from ../configs.yml in the same repository.
REFERENCE_SOURCE = (
    "NVIDIA Deep Learning Examples, PyTorch ResNet-50 v1.5 README, training performance, "
    "https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/Classification/ConvNets/resnet50v1.5/README.md"
)
REFERENCES = (
    ("1x A100 80GB (DGX A100)", "mixed precision (fp16 AMP)", 2470.0),
    ("1x A100 80GB (DGX A100)", "TF32", 938.0),
    ("1x V100 16GB (DGX-1)", "mixed precision (fp16 AMP)", 1200.0),
    ("1x V100 16GB (DGX-1)", "FP32", 367.0),
)


def rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    table = []
    for result in results:
        workload, summary = result["workload"], result["summary"]
        gpus = workload["processes"]
        raw = summary["raw"]["images_per_second"]["median"]
        dtrain = summary["dtrain"]["images_per_second"]["median"]
        ratio = summary["ratio_dtrain_over_raw"]
        table.append(
            [
                result.get("gpu", "?"),
                gpus,
                workload["precision"],
                workload["batch_size"],
                raw / gpus,
                dtrain / gpus,
                f"{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})",
            ]
        )
    return table


def report(paths: list[str]) -> str:
    results = [json.loads(Path(path).read_text()) for path in paths]
    measured = markdown_table(
        ["GPU", "GPUs", "precision", "batch/GPU", "raw DDP images/s per GPU", "dtrain images/s per GPU",
         "dtrain / raw (median, min-max)"],
        rows(results),
    )
    references = markdown_table(["published reference", "precision", "images/s"], REFERENCES)
    return (
        f"ResNet-50 224x224, synthetic data, measured:\n\n{measured}\n\n"
        f"Published single-GPU references ({REFERENCE_SOURCE}; real ImageNet through DALI, channels-last; "
        "the runs above use synthetic data, channels-first and Adam, so compare orders of magnitude, "
        f"not digits):\n\n{references}"
    )


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m bench.gpu_report RESULTS.json [...]", file=sys.stderr)
        return 2
    print(report(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
