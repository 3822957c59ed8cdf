"""The memory pre-flight against the GPU: `dtrain validate --estimate`'s number beside
`torch.cuda.max_memory_allocated` of real training steps, side by side.

    python bench/memory_estimate.py                 # on a GPU machine: estimate vs measured
    python bench/memory_estimate.py --cpu-only      # here: the estimates alone (the README table)

For each case (architecture, image size, batch, precision) it builds the built-in
ImageClassifier, estimates its peak per GPU on the CPU, then, on a GPU, runs three
optimizer steps (Adam; the first creates the optimizer state) and reads the peak the
caching allocator saw. The target is |estimate / measured - 1| <= 15%.
"""

from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))

from bench.common import markdown_table
from dtrain_trainer.memory import estimate_job, format_bytes
from dtrain_trainer.models import ImageClassifier

CASES = [
    # (arch, image size, batch, precision): the article's case first.
    ("resnet50", 224, 256, "16-mixed"),
    ("resnet50", 224, 256, "32-true"),
    ("resnet50", 224, 64, "32-true"),
    ("resnet18", 224, 128, "bf16-mixed"),
    ("vit_b_16", 224, 32, "bf16-mixed"),
]


def estimated(arch: str, size: int, batch: int, precision: str) -> int:
    model = ImageClassifier(arch=arch, num_classes=1000)
    settings = SimpleNamespace(precision=precision, batch_size=batch, accumulate_grad_batches=1)
    return estimate_job(model, None, (3, size, size), settings, None).estimate.total


def measured(arch: str, size: int, batch: int, precision: str) -> int:
    device = torch.device("cuda")
    model = ImageClassifier(arch=arch, num_classes=1000).to(device)
    if precision in ("bf16-true", "16-true"):
        model = model.to(torch.bfloat16 if precision.startswith("bf16") else torch.float16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    autocast = precision in ("16-mixed", "bf16-mixed")
    dtype = torch.float16 if precision == "16-mixed" else torch.bfloat16
    images = torch.randn(batch, 3, size, size, device=device)
    labels = torch.randint(0, 1000, (batch,), device=device)
    torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-only", action="store_true", help="print the estimates without a GPU")
    args = parser.parse_args()
    on_gpu = torch.cuda.is_available() and not args.cpu_only
    rows = []
    for arch, size, batch, precision in CASES:
        estimate = estimated(arch, size, batch, precision)
        if on_gpu:
            try:
                real = measured(arch, size, batch, precision)
                ratio = estimate / real
                rows.append((arch, size, batch, precision, format_bytes(estimate), format_bytes(real), f"{ratio:.3f}"))
            except torch.cuda.OutOfMemoryError:
                rows.append((arch, size, batch, precision, format_bytes(estimate), "out of memory", "-"))
            torch.cuda.empty_cache()
        else:
            rows.append((arch, size, batch, precision, format_bytes(estimate), "(no GPU)", "-"))
    device = torch.cuda.get_device_name() if on_gpu else "CPU only"
    print(f"memory estimate vs torch.cuda.max_memory_allocated ({device}; Adam, 3 steps)")
    print(markdown_table(["arch", "image", "batch", "precision", "estimate", "measured", "estimate / measured"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
