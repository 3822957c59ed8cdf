"""The built-in digits data module: the split, the images, and a real training run on the CPU to 95 %."""

from __future__ import annotations

import time

import lightning as L
import pytest
import torch

from dtrain_trainer.digits import DigitsDataModule, load_digits_tensors, stratified_split
from dtrain_trainer.models import ImageClassifier

ACCURACY_TARGET = 0.95


def test_the_split_is_stratified_disjoint_and_the_same_on_every_rank():
    _, labels = load_digits_tensors()
    assert len(labels) == 1797 and sorted(set(labels.tolist())) == list(range(10))
    train, val = stratified_split(labels, 0.2, seed=0)
    assert len(train) + len(val) == 1797 and not set(train.tolist()) & set(val.tolist())
    assert len(val) == 359
    per_class = torch.bincount(labels[val], minlength=10)
    assert per_class.min() >= 35 and per_class.max() <= 37  # a fifth of each class (174-183 images)
    again_train, again_val = stratified_split(labels, 0.2, seed=0)
    assert torch.equal(train, again_train) and torch.equal(val, again_val)
    assert not torch.equal(val, stratified_split(labels, 0.2, seed=1)[1])


def test_images_are_upscaled_with_three_channels_for_torchvision_models():
    data = DigitsDataModule(image_size=[40, 48], batch_size=16)
    assert (data.num_classes, data.sample_shape) == (10, (3, 40, 48))
    images, labels = next(iter(data.train_dataloader()))
    assert images.shape == (16, 3, 40, 48) and labels.dtype == torch.long
    assert torch.equal(images[:, 0], images[:, 2])  # the grey level in every channel
    assert -1.0 <= images.min() < -0.9 and 0.9 < images.max() <= 1.0
    val = data.val_dataloader()
    assert sum(len(batch[1]) for batch in val) == 359  # every validation image, none dropped
    with pytest.raises(ValueError, match="val_fraction must be a number between 0 and 1"):
        DigitsDataModule(val_fraction=1.0)
    with pytest.raises(ValueError, match="image_size must be"):
        DigitsDataModule(image_size="big")  # type: ignore[arg-type]


@pytest.mark.slow
def test_resnet18_reaches_95_percent_validation_accuracy_on_the_cpu():
    """The quick start's model and data, on one process: a real accuracy, in well under a minute of CPU."""
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    data = DigitsDataModule(image_size=32, batch_size=64)
    model = ImageClassifier(arch="resnet18", num_classes=10, optimizer="adam", lr=0.002, lr_schedule="cosine")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        deterministic=True,
    )
    started = time.monotonic()
    trainer.fit(model, datamodule=data)
    accuracy = float(trainer.callback_metrics["val_acc"])
    assert accuracy >= ACCURACY_TARGET, f"validation accuracy {accuracy:.3f} after {time.monotonic() - started:.0f} s"
