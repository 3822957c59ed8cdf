"""The built-in data modules: synthetic images (no download, no disk) and an ImageFolder tree.

The trainer passes `batch_size` and `num_workers` (trainer.batchSize, trainer.numWorkers)
to any data module whose constructor names them. Their training loaders are
torchdata StatefulDataLoaders (see `resumable`): a restart from a mid-epoch checkpoint continues the epoch
where it stopped. A data module tells the shape of one
sample through `sample_shape` (channels, height, width), which the ONNX export uses
when export.onnx.inputShape is not set; `num_classes` lets the trainer check the
model against the data before training starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from dtrain_trainer.resumable import EpochStatefulDataLoader

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def image_size_of(image_size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(image_size, int) and not isinstance(image_size, bool):
        size = (image_size, image_size)
    elif isinstance(image_size, (list, tuple)) and len(image_size) == 2:
        size = (int(image_size[0]), int(image_size[1]))
    else:
        raise ValueError(f"image_size must be a number or [height, width], got {image_size!r}")
    if min(size) < 1:
        raise ValueError(f"image_size must be positive, got {image_size!r}")
    return size


def default_pin_memory(pin_memory: bool | None) -> bool:
    return torch.cuda.is_available() if pin_memory is None else pin_memory


class BuiltinLoaders:
    """What the built-in data modules share: the loader settings the trainer sets, and their loaders."""

    batch_size: int
    num_workers: int
    pin_memory: bool

    def _batches(self, dataset: Any, train: bool, persistent_workers: bool) -> DataLoader[Any]:
        # Training resumes mid-epoch from a StatefulDataLoader; torch's RandomSampler is the one Lightning
        # replaces with a DistributedSampler (see resumable.py).
        loader = EpochStatefulDataLoader if train else DataLoader
        return loader(
            dataset,
            batch_size=self.batch_size,
            sampler=RandomSampler(dataset) if train else None,
            drop_last=train,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=persistent_workers,
        )


class SyntheticImages(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """`length` samples drawn from a fixed pool of random images with random labels.

    The pool keeps data generation off the critical path, so a benchmark measures the
    GPU and the interconnect rather than the random-number generator.
    """

    def __init__(self, length: int, shape: tuple[int, ...], num_classes: int, pool_size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        pool = min(pool_size, length)
        self.images = torch.randn((pool, *shape), generator=generator)
        self.labels = torch.randint(0, num_classes, (pool,), generator=generator)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        slot = index % len(self.labels)
        return self.images[slot], self.labels[slot]


class _SyntheticImageData(BuiltinLoaders):
    """SyntheticImageDataModule's behaviour, without a Lightning base (see `flavor.rebased`)."""

    def __init__(
        self,
        image_size: int | Sequence[int] = 224,
        channels: int = 3,
        num_classes: int = 1000,
        num_samples: int = 1024,
        pool_size: int = 64,
        seed: int = 0,
        batch_size: int = 32,
        num_workers: int = 0,
        pin_memory: bool | None = None,
    ) -> None:
        super().__init__()
        height, width = image_size_of(image_size)
        for name, value in (("channels", channels), ("num_classes", num_classes), ("num_samples", num_samples),
                            ("pool_size", pool_size)):
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        self.sample_shape = (channels, height, width)
        self.num_classes = num_classes
        self.num_samples = num_samples
        self.pool_size = pool_size
        self.seed = seed
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = default_pin_memory(pin_memory)

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
        dataset = SyntheticImages(self.num_samples, self.sample_shape, self.num_classes, self.pool_size, self.seed)
        return self._batches(dataset, train=True, persistent_workers=self.num_workers > 0)


class SyntheticImageDataModule(_SyntheticImageData, L.LightningDataModule):
    """Random images of a given size and class count, for smoke tests and benchmarks.

    Args:
        image_size: side of the square images, or [height, width].
        channels: channels per image.
        num_classes: labels are drawn from 0..num_classes-1.
        num_samples: training samples per epoch (over all ranks).
        pool_size: distinct images behind those samples.
        seed: seed of the generated data (the same on every rank).
        batch_size, num_workers: set by the trainer from trainer.batchSize and trainer.numWorkers.
        pin_memory: pin host memory for faster copies to the GPU (default: when a GPU is present).
    """

    _dtrain_behaviour = _SyntheticImageData


# What ImageFolder accepts (torchvision's own list of image extensions).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def is_image_file(path: str) -> bool:
    return path.lower().endswith(IMAGE_EXTENSIONS)


def decode_image_file(path: str) -> torch.Tensor:
    """An image file as a uint8 RGB tensor (channels, height, width).

    JPEGs go through torchvision.io's libjpeg-turbo decoder straight into a tensor, and the
    transforms below work on uint8 tensors: about twice PIL's rate per loader worker
    (measure yours with `python -m bench.data_pipeline`). Other formats decode the same way.
    """
    from torchvision.io import ImageReadMode, decode_image, read_file

    return decode_image(read_file(path), mode=ImageReadMode.RGB)


def image_transform(crop: tuple[int, int], train: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The ImageNet transforms on a uint8 image tensor, to a normalised float32 tensor.

    Training: RandomResizedCrop, horizontal flip. Validation: resize the short side to
    crop * 256/224, CenterCrop. Resizing happens on uint8 (antialiased), before the
    conversion to float, so each step touches a quarter of the bytes PIL's path does.
    """
    from torchvision.transforms import v2

    if train:
        geometry = [v2.RandomResizedCrop(crop, antialias=True), v2.RandomHorizontalFlip()]
    else:
        geometry = [v2.Resize(round(max(crop) * 256 / 224), antialias=True), v2.CenterCrop(crop)]
    return v2.Compose(  # type: ignore[no-any-return]
        [*geometry, v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    )


def _class_directories(root: Path) -> list[str]:
    return sorted(entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))


class _ImageFolderData(BuiltinLoaders):
    """ImageFolderDataModule's behaviour, without a Lightning base (see `flavor.rebased`)."""

    def __init__(
        self,
        train_dir: str,
        val_dir: str | None = None,
        image_size: int | Sequence[int] = 224,
        batch_size: int = 32,
        num_workers: int = 4,
        pin_memory: bool | None = None,
        persistent_workers: bool = True,
    ) -> None:
        super().__init__()
        self.train_dir = Path(train_dir)
        self.val_dir = Path(val_dir) if val_dir else None
        for name, path in (("train_dir", self.train_dir), ("val_dir", self.val_dir)):
            if path is not None and not path.is_dir():
                raise ValueError(f"{name} {str(path)!r} is not a directory (mount the data set there)")
        classes = _class_directories(self.train_dir)
        if not classes:
            raise ValueError(f"train_dir {str(self.train_dir)!r} holds no class directories (<dir>/<class>/<image>)")
        if self.val_dir is not None and _class_directories(self.val_dir) != classes:
            raise ValueError(f"val_dir {str(self.val_dir)!r} does not have the same class directories as train_dir")
        self.crop = image_size_of(image_size)
        self.sample_shape = (3, *self.crop)
        self.num_classes = len(classes)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = default_pin_memory(pin_memory)
        self.persistent_workers = persistent_workers and num_workers > 0

    def _loader(self, root: Path, train: bool) -> DataLoader[tuple[torch.Tensor, int]]:
        from torchvision import datasets

        dataset = datasets.ImageFolder(
            str(root), transform=image_transform(self.crop, train), loader=decode_image_file, is_valid_file=is_image_file
        )
        return self._batches(dataset, train, self.persistent_workers)

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, int]]:
        return self._loader(self.train_dir, train=True)

    def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, int]] | list[DataLoader[tuple[torch.Tensor, int]]]:
        # An empty list tells Lightning there is no validation.
        return [] if self.val_dir is None else self._loader(self.val_dir, train=False)


class ImageFolderDataModule(_ImageFolderData, L.LightningDataModule):
    """Images in `<dir>/<class name>/<image>` trees (the ImageNet layout), with the standard ImageNet transforms.

    Training: RandomResizedCrop(image_size), horizontal flip, normalisation.
    Validation: resize the short side to image_size * 256/224, CenterCrop(image_size), normalisation.

    Args:
        train_dir: the training tree; its class directories define the classes.
        val_dir: the validation tree with the same class directories (optional).
        image_size: side of the square crops, or [height, width].
        batch_size, num_workers: set by the trainer from trainer.batchSize and trainer.numWorkers.
        pin_memory: pin host memory for faster copies to the GPU (default: when a GPU is present).
        persistent_workers: keep loader workers alive between epochs (when num_workers > 0).
    """

    _dtrain_behaviour = _ImageFolderData
