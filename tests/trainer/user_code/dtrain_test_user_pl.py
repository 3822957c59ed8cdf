"""A user's model and data module written the classic way, `import pytorch_lightning as pl`."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class TinyClassifier(pl.LightningModule):
    def __init__(self, num_classes: int = 4, lr: float = 0.05) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes)
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class RandomImageData(pl.LightningDataModule):
    def __init__(self, num_samples: int = 64, image_size: int = 16, num_classes: int = 4, batch_size: int = 8) -> None:
        super().__init__()
        self.num_samples = num_samples
        self.num_classes = num_classes
        self.sample_shape = (3, image_size, image_size)
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        generator = torch.Generator().manual_seed(1)
        images = torch.randn((self.num_samples, *self.sample_shape), generator=generator)
        labels = torch.randint(0, self.num_classes, (self.num_samples,), generator=generator)
        return DataLoader(TensorDataset(images, labels), batch_size=self.batch_size, shuffle=True)
