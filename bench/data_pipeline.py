"""Data-pipeline images/s per loader worker beside the model's own step rate: which one limits training.

A folder of JPEGs (photo-sized by default, 500x375 like an average ImageNet image) is made
in a temporary directory and read through ImageFolderDataModule's training pipeline in one
process, which is what one DataLoader worker does: decode, RandomResizedCrop, flip,
normalise. Two pipelines are timed on the same files: dtrain's (torchvision.io's
libjpeg-turbo decoder and v2 transforms on uint8 tensors) and the classic one (PIL and
ToTensor), for comparison. The model's rate is forward + backward + optimizer step of the
built-in classifier on random batches, on the GPU when there is one.

The table's last column is what a person needs: loader workers per training process that
keep the model fed (model images/s divided by one worker's images/s).

    .venv/bin/python -m bench.data_pipeline                     # resnet50, 224 px crops
    .venv/bin/python -m bench.data_pipeline --arch resnet18 --crop 128 --images 400
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import machine, markdown_table, write_results
from dtrain_trainer.data import decode_image_file, image_transform, is_image_file
from dtrain_trainer.models import ImageClassifier


def make_jpegs(root: Path, count: int, width: int, height: int) -> Path:
    """`count` smooth random JPEGs (quality 90) in two class folders: photographs compress like this, noise does not."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for index in range(count):
        folder = root / f"class{index % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        coarse = rng.integers(0, 255, (height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((width, height), Image.BILINEAR)
        image.save(folder / f"{index}.jpg", quality=90)
    return root


def classic_pipeline(crop: int) -> tuple[Callable[[str], Any], Callable[[Any], torch.Tensor]]:
    from PIL import Image
    from torchvision import transforms

    def load(path: str) -> Any:
        with open(path, "rb") as file:
            return Image.open(file).convert("RGB")

    transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(crop),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    return load, transform


def worker_rate(root: Path, load: Callable[[str], Any], transform: Callable[[Any], torch.Tensor], seconds: float) -> float:
    """Images/s of one process reading `root` through `load` and `transform` (one DataLoader worker's work)."""
    from torchvision import datasets

    dataset = datasets.ImageFolder(str(root), transform=transform, loader=load, is_valid_file=is_image_file)
    for index in range(min(5, len(dataset))):  # warm-up: imports, first allocations
        dataset[index]
    done, started = 0, time.perf_counter()
    while True:
        for index in range(len(dataset)):
            image, _ = dataset[index]
            assert image.dtype == torch.float32
            done += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return done / elapsed


def model_rate(arch: str, crop: int, batch: int, steps: int, device: torch.device) -> float:
    """Images/s of forward + backward + optimizer step of the built-in classifier, warm-up excluded."""
    model = ImageClassifier(arch=arch, num_classes=1000).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(batch, 3, crop, crop, device=device)
    labels = torch.randint(0, 1000, (batch,), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()

    for _ in range(2):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return batch * steps / (time.perf_counter() - started)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.data_pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny images and model: seconds, for the tests")
    parser.add_argument("--images", type=int, default=None, help="JPEGs to make (default 200; smoke 8)")
    parser.add_argument("--size", default=None, help="JPEG width x height (default 500x375; smoke 64x48)")
    parser.add_argument("--crop", type=int, default=None, help="training crop (default 224; smoke 32)")
    parser.add_argument("--arch", default=None, help="model for the step rate (default resnet50; smoke resnet18)")
    parser.add_argument("--batch", type=int, default=None, help="batch per step (default 64; smoke 4)")
    parser.add_argument("--steps", type=int, default=None, help="timed model steps (default 10; smoke 2)")
    parser.add_argument("--seconds", type=float, default=None, help="time each pipeline this long (default 5)")
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when there is one)")
    parser.add_argument("--out", help="results JSON (default bench/results/data_pipeline.json)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    smoke = args.smoke
    images = args.images or (8 if smoke else 200)
    width, height = (int(v) for v in (args.size or ("64x48" if smoke else "500x375")).split("x"))
    crop = args.crop or (32 if smoke else 224)
    arch = args.arch or ("resnet18" if smoke else "resnet50")
    batch = args.batch or (4 if smoke else 64)
    steps = args.steps or (2 if smoke else 10)
    seconds = args.seconds if args.seconds is not None else (0.2 if smoke else 5.0)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one loader worker is one thread's worth of work
    with tempfile.TemporaryDirectory(prefix="dtrain-jpegs-") as workdir:
        root = make_jpegs(Path(workdir), images, width, height)
        fast = worker_rate(root, decode_image_file, image_transform((crop, crop), train=True), seconds)
        classic = worker_rate(root, *classic_pipeline(crop), seconds)
    torch.set_num_threads(threads)
    model = model_rate(arch, crop, batch, steps, device)
    rows = [
        ["dtrain: decode_jpeg + v2 on uint8", fast, model / fast],
        ["classic: PIL + ToTensor", classic, model / classic],
    ]
    print(f"JPEGs {width}x{height}, crop {crop}; model {arch}, batch {batch}, on {device}: {model:,.1f} images/s\n")
    print(markdown_table(["pipeline (one loader worker)", "images/s per worker", "workers to feed the model"], rows))
    print(f"\ndtrain's pipeline is {fast / classic:.2f}x the classic one per worker.")
    results: dict[str, Any] = {
        "machine": machine(),
        "workload": {"images": images, "width": width, "height": height, "crop": crop, "arch": arch,
                     "batch": batch, "device": str(device)},
        "model_images_per_second": model,
        "pipelines": {
            "dtrain": {"images_per_second_per_worker": fast, "workers_needed": math.ceil(model / fast)},
            "classic": {"images_per_second_per_worker": classic, "workers_needed": math.ceil(model / classic)},
        },
        "speedup_dtrain_over_classic": fast / classic,
    }
    path = write_results("data_pipeline", results, args.out)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
