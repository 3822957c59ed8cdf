"""The built-in model and data modules, trained briefly in this process by a plain Lightning Trainer."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image

from dtrain_trainer.data import ImageFolderDataModule, SyntheticImageDataModule
from dtrain_trainer.models import ImageClassifier, classification_architectures


def image_tree(root: Path, classes: tuple[str, ...], per_class: int) -> Path:
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            pixels = rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{index}.png")
    return root


def quiet_trainer(**kwargs: object) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,  # type: ignore[arg-type]
    )


def test_image_folder_trains_and_validates(tmp_path: Path) -> None:
    classes = ("cat", "dog")
    data = ImageFolderDataModule(
        train_dir=str(image_tree(tmp_path / "train", classes, 4)),
        val_dir=str(image_tree(tmp_path / "val", classes, 2)),
        image_size=32,
        batch_size=4,
        num_workers=0,
    )
    assert (data.num_classes, data.sample_shape) == (2, (3, 32, 32))
    images, labels = next(iter(data.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and set(labels.tolist()) <= {0, 1}
    model = ImageClassifier(arch="resnet18", num_classes=2, optimizer="adamw", lr=0.01, lr_schedule="cosine")
    trainer = quiet_trainer(max_epochs=2, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=data)
    assert trainer.global_step == 4
    assert {"val_loss", "val_acc"} <= set(trainer.callback_metrics)
    # The cosine schedule ran down over the run's steps.
    assert trainer.optimizers[0].param_groups[0]["lr"] < 0.01 * 0.2


def test_image_folder_without_validation(tmp_path: Path) -> None:
    data = ImageFolderDataModule(train_dir=str(image_tree(tmp_path / "train", ("a", "b", "c"), 2)), image_size=[24, 32],
                                 batch_size=2, num_workers=0)
    assert data.sample_shape == (3, 24, 32)
    trainer = quiet_trainer(max_steps=2)
    trainer.fit(ImageClassifier(arch="resnet18", num_classes=3), datamodule=data)
    assert trainer.global_step == 2 and "val_loss" not in trainer.callback_metrics


def test_image_folder_checks_its_directories(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no class directories"):
        ImageFolderDataModule(train_dir=str(tmp_path / "empty"))
    image_tree(tmp_path / "train", ("a", "b"), 1)
    image_tree(tmp_path / "val", ("a", "c"), 1)
    with pytest.raises(ValueError, match="not have the same class directories"):
        ImageFolderDataModule(train_dir=str(tmp_path / "train"), val_dir=str(tmp_path / "val"))


def test_synthetic_data_is_the_same_on_every_rank() -> None:
    a = SyntheticImageDataModule(image_size=[8, 16], channels=1, num_classes=3, num_samples=10, batch_size=5)
    b = SyntheticImageDataModule(image_size=[8, 16], channels=1, num_classes=3, num_samples=10, batch_size=5)
    dataset_a, dataset_b = a.train_dataloader().dataset, b.train_dataloader().dataset
    assert len(dataset_a) == 10 and a.sample_shape == (1, 8, 16)
    for index in (0, 9):
        assert torch.equal(dataset_a[index][0], dataset_b[index][0])
        assert 0 <= int(dataset_a[index][1]) < 3
    with pytest.raises(ValueError, match="image_size"):
        SyntheticImageDataModule(image_size=[1, 2, 3])


def test_classifier_options() -> None:
    assert "resnet50" in classification_architectures()
    assert "fasterrcnn_resnet50_fpn" not in classification_architectures()
    sgd = ImageClassifier(arch="resnet18", num_classes=3, optimizer="sgd", lr=0.1, momentum=0.8)
    optimizer = sgd.configure_optimizers()
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["momentum"] == 0.8
    assert isinstance(ImageClassifier(arch="resnet18").configure_optimizers(), torch.optim.Adam)
    assert sgd(torch.zeros(2, 3, 32, 32)).shape == (2, 3)
    for bad in ({"optimizer": "lbfgs"}, {"lr_schedule": "step"}, {"num_classes": 0}, {"lr": 0}):
        with pytest.raises(ValueError):
            ImageClassifier(arch="resnet18", **bad)  # type: ignore[arg-type]


def test_image_folder_decodes_jpegs_to_what_the_pil_path_gives(tmp_path: Path) -> None:
    from torchvision import transforms

    from dtrain_trainer.data import IMAGENET_MEAN, IMAGENET_STD, decode_image_file, image_transform

    rng = np.random.default_rng(1)
    # A smooth image (as photographs are), saved as a JPEG, and a grayscale one.
    ramp = np.linspace(0, 255, 80 * 60, dtype=np.float64).reshape(60, 80)
    pixels = np.stack([ramp, ramp[::-1], np.full_like(ramp, 128)], axis=-1) + rng.normal(0, 4, (60, 80, 3))
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(tmp_path / "color.jpg", quality=95)
    Image.fromarray(ramp.astype(np.uint8), mode="L").save(tmp_path / "gray.jpg")

    decoded = decode_image_file(str(tmp_path / "color.jpg"))
    assert decoded.dtype == torch.uint8 and decoded.shape == (3, 60, 80)
    assert decode_image_file(str(tmp_path / "gray.jpg")).shape == (3, 60, 80)

    pil = transforms.Compose(
        [transforms.Resize(37), transforms.CenterCrop(32), transforms.ToTensor(),
         transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    )(Image.open(tmp_path / "color.jpg").convert("RGB"))
    fast = image_transform((32, 32), train=False)(decoded)
    assert fast.dtype == torch.float32 and fast.shape == pil.shape == (3, 32, 32)
    assert (fast - pil).abs().mean() < 0.05
    train = image_transform((32, 32), train=True)(decoded)
    assert train.shape == (3, 32, 32) and train.dtype == torch.float32
