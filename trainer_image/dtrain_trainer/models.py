"""The built-in model: any torchvision classification architecture, trained from scratch.

`classPath: dtrain_trainer.models.ImageClassifier` (or just `ImageClassifier`), with
initArgs such as `{arch: resnet50, num_classes: 1000, optimizer: adam, lr: 0.001}`.
Weights are never downloaded: a worker pod usually has no internet access, and a
download in every rank of a large gang is a self-inflicted outage.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
import torchvision

OPTIMIZERS = ("adam", "adamw", "sgd")
LR_SCHEDULES = ("constant", "cosine")


def classification_architectures() -> list[str]:
    """torchvision's classification models (detection, segmentation and video models excluded)."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


class _ImageClassifierBehaviour:
    """ImageClassifier's behaviour, without a Lightning base (see `flavor.rebased`)."""

    hparams: Any

    def __init__(
        self,
        arch: str = "resnet50",
        num_classes: int = 1000,
        optimizer: str = "adam",
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        momentum: float = 0.9,
        lr_schedule: str = "constant",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        known = classification_architectures()
        if arch not in known:
            hint = difflib.get_close_matches(arch, known, n=1)
            suggestion = f"did you mean {hint[0]!r}? " if hint else ""
            raise ValueError(f"arch {arch!r} is not a torchvision classification model; {suggestion}e.g. resnet50")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule {lr_schedule!r} is not one of {', '.join(LR_SCHEDULES)}")
        if not (isinstance(num_classes, int) and num_classes >= 1):
            raise ValueError(f"num_classes must be a whole number >= 1, got {num_classes!r}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr!r}")
        # Named explicitly: Lightning's frame inspection looks for a LightningModule's own __init__.
        self.save_hyperparameters(  # type: ignore[attr-defined]
            {
                "arch": arch,
                "num_classes": num_classes,
                "optimizer": optimizer,
                "lr": lr,
                "weight_decay": weight_decay,
                "momentum": momentum,
                "lr_schedule": lr_schedule,
                "label_smoothing": label_smoothing,
            }
        )
        self.num_classes = num_classes
        self.net = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)  # type: ignore[no-any-return]

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels, label_smoothing=self.hparams["label_smoothing"])

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = self._loss(self(images), labels)  # type: ignore[operator]
        self.log("train_loss", loss)  # type: ignore[attr-defined]
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)  # type: ignore[operator]
        self.log("val_loss", self._loss(logits, labels), sync_dist=True, prog_bar=True)  # type: ignore[attr-defined]
        self.log(  # type: ignore[attr-defined]
            "val_acc", (logits.argmax(dim=1) == labels).float().mean(), sync_dist=True, prog_bar=True
        )

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        params = self.parameters()  # type: ignore[attr-defined]
        if hp["optimizer"] == "sgd":
            optimizer: torch.optim.Optimizer = torch.optim.SGD(
                params, lr=hp["lr"], momentum=hp["momentum"], nesterov=True, weight_decay=hp["weight_decay"]
            )
        elif hp["optimizer"] == "adamw":
            optimizer = torch.optim.AdamW(params, lr=hp["lr"], weight_decay=hp["weight_decay"])
        else:
            optimizer = torch.optim.Adam(params, lr=hp["lr"], weight_decay=hp["weight_decay"])
        if hp["lr_schedule"] == "constant":
            return optimizer
        estimated = self.trainer.estimated_stepping_batches  # type: ignore[attr-defined]
        if not math.isfinite(estimated):
            raise ValueError("lr_schedule cosine needs a run of known length: set trainer.maxSteps or maxEpochs")
        total_steps = max(1, int(estimated))
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class ImageClassifier(_ImageClassifierBehaviour, L.LightningModule):
    """A torchvision classifier with cross-entropy loss.

    Args:
        arch: torchvision architecture name, e.g. resnet50, resnet18, efficientnet_b0, vit_b_16 (trained from
            scratch: no pretrained weights).
        num_classes: number of classes of the data.
        optimizer: adam (default), adamw or sgd (with Nesterov momentum).
        lr: learning rate.
        weight_decay: L2 penalty (decoupled for adamw).
        momentum: momentum of sgd.
        lr_schedule: constant, or cosine decay to 0 over the run's optimizer steps.
        label_smoothing: label smoothing of the cross-entropy loss.
    """

    # Built on lightning; `flavor.rebased` puts it on pytorch_lightning for a job that trains there.
    _dtrain_behaviour = _ImageClassifierBehaviour
