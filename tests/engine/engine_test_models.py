"""A tiny image classifier and the artifacts training would leave for it: model.onnx, a
checkpoint and artifacts.json. Importable as `engine_test_models.TinyClassifier`, which is
the classPath the PyTorch baseline instantiates."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch import nn

from dtrain_operator.api import contract

IMAGE_SHAPE = (3, 32, 32)
CLASS_PATH = "engine_test_models.TinyClassifier"


class TinyClassifier(nn.Module):
    def __init__(self, channels: int = 8, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2, padding=1),
            nn.ReLU(),
        )
        self.head = nn.Linear(channels, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).mean(dim=(2, 3)))


def make_model(seed: int = 0) -> TinyClassifier:
    torch.manual_seed(seed)
    model = TinyClassifier()
    # Non-trivial BatchNorm statistics, as after training.
    model.features[1].running_mean.uniform_(-0.5, 0.5)
    model.features[1].running_var.uniform_(0.5, 2.0)
    return model.eval()


def export_onnx(model: nn.Module, path: Path, static_batch: int | None = None) -> Path:
    """model.onnx with a dynamic batch axis, or a fixed one when `static_batch` is given."""
    batch = static_batch or 2
    dynamic = None if static_batch else {"images": {0: "batch"}, "logits": {0: "batch"}}
    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated but takes 0.2 s where torch.export takes seconds.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (torch.randn(batch, *IMAGE_SHAPE),),
            str(path),
            input_names=["images"],
            output_names=["logits"],
            dynamic_axes=dynamic,
            opset_version=17,
            dynamo=False,
        )
    return path


def write_training_artifacts(model: nn.Module, directory: Path, static_batch: int | None = None) -> Path:
    """What the trainer leaves in artifacts.dir: model.onnx, a Lightning-style checkpoint, artifacts.json."""
    directory.mkdir(parents=True, exist_ok=True)
    onnx_path = export_onnx(model, directory / contract.ONNX_FILE_NAME, static_batch)
    checkpoints = directory / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    torch.save({"state_dict": model.state_dict(), "global_step": 3}, checkpoints / "last.ckpt")
    (directory / contract.ARTIFACTS_FILE_NAME).write_text(
        json.dumps(
            {
                contract.ARTIFACTS_KEY_CHECKPOINT: "checkpoints/last.ckpt",
                contract.ARTIFACTS_KEY_MODEL: {"classPath": CLASS_PATH, "initArgs": {"channels": 8}},
            }
        )
    )
    return onnx_path
