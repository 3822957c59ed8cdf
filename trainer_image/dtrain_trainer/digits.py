"""The built-in real data set: the UCI handwritten digits, shipped in this package (no download).

`classPath: dtrain_trainer.digits.DigitsDataModule`. The 1,797 images of 8x8 pixels (16 grey
levels, 10 classes, about 180 per class) are `digits.csv.gz` beside this module, so a worker
pod without internet access and a laptop without a data set both have them. They are split
into training and validation sets (stratified, the same split on every rank), upscaled to
`image_size` for the torchvision architectures (whose stems downsample 32x) and given three
channels. The quick start trains on it, so its summary shows a real validation accuracy.

Source: E. Alpaydin, C. Kaynak, "Optical Recognition of Handwritten Digits", UCI Machine
Learning Repository (1998), CC BY 4.0; the file is scikit-learn's copy (one row per image: its
64 pixels, then its label). Not scikit-learn itself: it brings SciPy, which torchmetrics then
imports at every trainer start (about a second of each start and restart).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import lightning as L
import numpy
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from dtrain_trainer.data import BuiltinLoaders, default_pin_memory, image_size_of

NUM_CLASSES = 10
GREY_LEVELS = 16.0  # pixel values are 0..16
DIGITS_FILE = Path(__file__).with_name("digits.csv.gz")


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 digits as (N, 8, 8) floats in [0, 1] and (N,) labels."""
    rows = numpy.loadtxt(DIGITS_FILE, delimiter=",", dtype=numpy.float32)
    images = torch.from_numpy(rows[:, :-1].reshape(-1, 8, 8).copy()) / GREY_LEVELS
    labels = torch.from_numpy(rows[:, -1].astype(numpy.int64))
    return images, labels


def stratified_split(labels: torch.Tensor, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the training and validation samples: `val_fraction` of each class, shuffled by `seed`."""
    generator = torch.Generator().manual_seed(seed)
    train, val = [], []
    for label in range(int(labels.max()) + 1):
        members = torch.nonzero(labels == label).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        cut = round(len(members) * val_fraction)
        val.append(members[:cut])
        train.append(members[cut:])
    return torch.cat(train).sort().values, torch.cat(val).sort().values


def prepare_images(images: torch.Tensor, size: tuple[int, int], channels: int) -> torch.Tensor:
    """(N, 8, 8) in [0, 1] to (N, channels, H, W), bilinearly upscaled and normalised to mean 0, std about 1."""
    batch = images.unsqueeze(1)
    if tuple(batch.shape[-2:]) != size:
        batch = F.interpolate(batch, size=size, mode="bilinear", align_corners=False)
    batch = (batch - 0.5) / 0.5
    return batch.expand(-1, channels, -1, -1).contiguous()


class _DigitsData(BuiltinLoaders):
    """DigitsDataModule's behaviour, without a Lightning base: `flavor.rebased` puts it on the package
    of the job's model (lightning or pytorch_lightning)."""

    def __init__(
        self,
        image_size: int | Sequence[int] = 32,
        channels: int = 3,
        val_fraction: float = 0.2,
        seed: int = 0,
        batch_size: int = 32,
        num_workers: int = 0,
        pin_memory: bool | None = None,
    ) -> None:
        super().__init__()
        height, width = image_size_of(image_size)
        if not (isinstance(channels, int) and channels >= 1):
            raise ValueError(f"channels must be a whole number >= 1, got {channels!r}")
        if isinstance(val_fraction, bool) or not (isinstance(val_fraction, (int, float)) and 0 < val_fraction < 1):
            raise ValueError(f"val_fraction must be a number between 0 and 1 (exclusive), got {val_fraction!r}")
        self.sample_shape = (channels, height, width)
        self.num_classes = NUM_CLASSES
        self.val_fraction = float(val_fraction)
        self.seed = seed
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = default_pin_memory(pin_memory)
        self._train: TensorDataset | None = None
        self._val: TensorDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self._train is not None:
            return
        images, labels = load_digits_tensors()
        train, val = stratified_split(labels, self.val_fraction, self.seed)
        prepared = prepare_images(images, self.sample_shape[1:], self.sample_shape[0])
        self._train = TensorDataset(prepared[train], labels[train])
        self._val = TensorDataset(prepared[val], labels[val])

    def _loader(self, dataset: TensorDataset | None, train: bool) -> DataLoader[tuple[torch.Tensor, ...]]:
        if dataset is None:
            self.setup()
            dataset = self._train if train else self._val
        assert dataset is not None
        return self._batches(dataset, train, persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        return self._loader(self._train, train=True)

    def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        return self._loader(self._val, train=False)


class DigitsDataModule(_DigitsData, L.LightningDataModule):
    """UCI handwritten digits (in the trainer package, no download): 10 classes, real labels, a real validation accuracy.

    Args:
        image_size: side of the upscaled square images, or [height, width].
        channels: channels per image; the grey level is repeated (3, as torchvision models expect).
        val_fraction: share of each class held out for validation (0.2: 1,438 training and 359
            validation images).
        seed: seed of the split (the same on every rank; the trainer's seed shuffles the batches).
        batch_size, num_workers: set by the trainer from trainer.batchSize and trainer.numWorkers.
        pin_memory: pin host memory for faster copies to the GPU (default: when a GPU is present).
    """

    _dtrain_behaviour = _DigitsData
