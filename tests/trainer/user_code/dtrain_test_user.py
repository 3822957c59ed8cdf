"""A user's own model and data module, as a user would ship them in an image (tests put this folder on PYTHONPATH).

The model records what the trainer tests need to see from inside training, through
ordinary Lightning hooks: a digest of its weights at the start and end of training,
of the first batch it saw, and the world size; and it can die at given steps, once each,
the way a node does.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dtrain_trainer.models import ImageClassifier

CRASH_EXIT_CODE = 17


def first_time_at(module: L.LightningModule, steps: int | list[int] | None, marker: Path | None) -> bool:
    """Whether the module's step is one of `steps` not reached before: `marker` records the steps reached."""
    step = module.trainer.global_step
    if marker is None or step not in ([steps] if isinstance(steps, int) else steps or []):
        return False
    if str(step) in (marker.read_text().split() if marker.exists() else []):
        return False
    with open(marker, "a") as record:
        record.write(f"{step}\n")
    return True


def crash_once_at(module: L.LightningModule, steps: int | list[int] | None, marker: Path | None) -> None:
    """Die as a node does (no cleanup, no final checkpoint) at each of `steps`, once: `marker` records the steps died at."""
    if first_time_at(module, steps, marker):
        os._exit(CRASH_EXIT_CODE)


def trained_samples(sample_log: str | Path) -> dict[tuple[int, int], list[int]]:
    """The sample ids each (epoch, step) trained, over every rank, from the last run of the gang that trained it:
    what TinyClassifier's `sample_log` files (`<sample_log>.rank<r>`) say."""
    prefix = Path(sample_log)
    runs: dict[tuple[int, int], dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for log in prefix.parent.glob(f"{prefix.name}.rank*"):
        for line in log.read_text().splitlines():
            resumed_from, epoch, step, *ids = map(int, line.split())
            runs[(epoch, step)][resumed_from].extend(ids)
    return {key: sorted(by_run[max(by_run)]) for key, by_run in sorted(runs.items())}


def tensor_digest(tensors: list[torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class TinyClassifier(L.LightningModule):
    def __init__(
        self,
        num_classes: int = 4,
        lr: float = 0.05,
        record_dir: str | None = None,
        crash_at_step: int | list[int] | None = None,
        crash_marker: str | None = None,
        crash_on_rank: int | None = None,
        batch_log: str | None = None,
        sample_log: str | None = None,
        ballast_mb: int = 0,
        step_sleep: float = 0.0,
        sigterm_at_train_end: int | None = None,
        sigterm_at_step: int | None = None,
    ) -> None:
        super().__init__()
        # Rank 0 sends itself SIGTERM after this step, once (recorded in crash_marker): a pod deleted mid-run, as
        # the operator deletes a gang it resizes; the gang stops at its next step with a checkpoint.
        self.sigterm_at_step = sigterm_at_step
        # This rank sends itself SIGTERM once training is over, after the callbacks' train-end hooks (the final
        # checkpoint) and before Lightning's teardown: a pod deleted just as its run ends.
        self.sigterm_at_train_end = sigterm_at_train_end
        # A large checkpoint without a large model: a saved buffer of this many MiB.
        self.register_buffer("ballast", torch.zeros(ballast_mb * (1 << 20) // 4))
        # A slow step, for tests that act while training runs.
        self.step_sleep = step_sleep
        self.batch_log = Path(batch_log) if batch_log else None
        self.sample_log = Path(sample_log) if sample_log else None
        self.num_classes = num_classes
        self.lr = lr
        self.record_dir = Path(record_dir) if record_dir else None
        self.crash_at_step = crash_at_step
        self.crash_marker = Path(crash_marker) if crash_marker else None
        # Only this global rank dies at crash_at_step (None: whichever gets there first); the others survive it.
        self.crash_on_rank = crash_on_rank
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes)
        )
        self._record: dict[str, object] = {}

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        images, labels, *ids = batch
        if self.sample_log is not None:
            # The sample ids of each micro-batch (IndexedImageData), by the step they count towards and the step
            # this run of the gang resumed from (a step trained again after a restart is the later run's).
            with open(f"{self.sample_log}.rank{self.global_rank}", "a") as log:
                resumed_from, step = self._record["resumed_from"], self.trainer.global_step
                log.write(f"{resumed_from} {self.trainer.current_epoch} {step} {' '.join(map(str, ids[0].tolist()))}\n")
        if self.step_sleep:
            time.sleep(self.step_sleep)
        if "first_batch" not in self._record:
            self._record["first_batch"] = tensor_digest([images])
        loss = F.cross_entropy(self(images), labels)
        if self.batch_log is not None:
            # Every batch each rank trains on, in order (what an exact resume must reproduce), and its loss.
            with open(f"{self.batch_log}.rank{self.global_rank}", "a") as log:
                log.write(f"{self.trainer.current_epoch} {batch_idx} {tensor_digest([images])[:12]} {loss.item()!r}\n")
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def on_train_start(self) -> None:
        self._record["start_weights"] = tensor_digest(list(self.parameters()))
        self._record["world_size"] = self.trainer.world_size
        self._record["resumed_from"] = self.trainer.global_step

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        if self.crash_on_rank in (None, self.global_rank):
            crash_once_at(self, self.crash_at_step, self.crash_marker)
        if self.global_rank == 0 and first_time_at(self, self.sigterm_at_step, self.crash_marker):
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_end(self) -> None:
        if self.sigterm_at_train_end == self.global_rank:
            os.kill(os.getpid(), signal.SIGTERM)
        if self.record_dir is None:
            return
        self._record["end_weights"] = tensor_digest(list(self.parameters()))
        self._record["global_step"] = self.trainer.global_step
        self.record_dir.mkdir(parents=True, exist_ok=True)
        (self.record_dir / f"rank{self.global_rank}.json").write_text(json.dumps(self._record))


class RandomImageData(L.LightningDataModule):
    def __init__(
        self, num_samples: int = 64, image_size: int = 16, num_classes: int = 4, batch_size: int = 8, num_workers: int = 0
    ) -> None:
        super().__init__()
        self.num_samples = num_samples
        self.num_classes = num_classes
        self.sample_shape = (3, image_size, image_size)
        self.batch_size = batch_size
        self.num_workers = num_workers

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        generator = torch.Generator().manual_seed(1)
        images = torch.randn((self.num_samples, *self.sample_shape), generator=generator)
        labels = torch.randint(0, self.num_classes, (self.num_samples,), generator=generator)
        return DataLoader(
            TensorDataset(images, labels), batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers
        )


class IndexedImageData(RandomImageData):
    """RandomImageData whose batches carry each sample's index too, for tests of which samples were trained."""

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        images, labels = super().train_dataloader().dataset.tensors
        return DataLoader(
            TensorDataset(images, labels, torch.arange(self.num_samples)), batch_size=self.batch_size, shuffle=True
        )


class CrashingImageClassifier(ImageClassifier):
    """dtrain's built-in model, dying as TinyClassifier does at `crash_at_step` (each step once)."""

    def __init__(self, crash_at_step: int | list[int] | None = None, crash_marker: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.crash_at_step = crash_at_step
        self.crash_marker = Path(crash_marker) if crash_marker else None

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        crash_once_at(self, self.crash_at_step, self.crash_marker)


class NotAModule:
    """Something a user might point classPath at by mistake."""


class UnexportableClassifier(TinyClassifier):
    """Trains fine; its output depends on Python state that an ONNX export bakes in, so the export's check fails."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.calls = 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.net(images) * float(self.calls)


class UnusedParameterClassifier(TinyClassifier):
    """Has a layer its forward never uses: DDP without find_unused_parameters fails on it."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.unused = nn.Linear(4, 4)


class ValidatedClassifier(TinyClassifier):
    """Logs what a tutorial model logs: val_loss and val_acc, a prog_bar metric, and one only the spec names."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        self.log("train_acc", (logits.argmax(dim=1) == labels).float().mean(), prog_bar=True)
        self.log("weight_norm", torch.linalg.vector_norm(self.net[0].weight.detach()))
        return F.cross_entropy(logits, labels)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)
        self.log("val_loss", F.cross_entropy(logits, labels), prog_bar=True)
        self.log("val_acc", (logits.argmax(dim=1) == labels).float().mean(), prog_bar=True)


class RandomImageDataWithValidation(RandomImageData):
    def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        generator = torch.Generator().manual_seed(2)
        images = torch.randn((16, *self.sample_shape), generator=generator)
        labels = torch.randint(0, self.num_classes, (16,), generator=generator)
        return DataLoader(TensorDataset(images, labels), batch_size=self.batch_size)
