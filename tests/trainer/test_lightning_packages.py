"""Models on pytorch_lightning, lightning.pytorch and lightning all train, each with its own package's Trainer."""

from __future__ import annotations

from pathlib import Path

import lightning
import lightning.pytorch
import pytest
import pytorch_lightning
import torch

from dtrain_trainer import flavor
from dtrain_trainer.data import ImageFolderDataModule, SyntheticImageDataModule
from dtrain_trainer.digits import DigitsDataModule
from dtrain_trainer.models import ImageClassifier

from .conftest import USER_DATA, USER_MODEL, read_jsonl, run_trainer, trainer_config, write_config

PL_MODEL = "dtrain_test_user_pl.TinyClassifier"
PL_DATA = "dtrain_test_user_pl.RandomImageData"
SYNTHETIC = {"classPath": "SyntheticImageDataModule", "initArgs": {"image_size": 16, "num_classes": 4, "num_samples": 64}}
RESNET = {"classPath": "ImageClassifier", "initArgs": {"arch": "resnet18", "num_classes": 4}}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "data", "package"),
    [
        ({"classPath": PL_MODEL}, {"classPath": PL_DATA}, flavor.PYTORCH_LIGHTNING),
        ({"classPath": PL_MODEL}, SYNTHETIC, flavor.PYTORCH_LIGHTNING),
        (RESNET, {"classPath": PL_DATA}, flavor.PYTORCH_LIGHTNING),
        ({"classPath": USER_MODEL}, {"classPath": USER_DATA}, flavor.LIGHTNING),
    ],
    ids=["both-pytorch_lightning", "pytorch_lightning-model-builtin-data", "builtin-model-pytorch_lightning-data", "lightning"],
)
def test_the_package_of_the_users_class_trains_it(
    tmp_path: Path, model: dict[str, object], data: dict[str, object], package: str
) -> None:
    progress = tmp_path / "progress.jsonl"
    config = trainer_config(tmp_path, model=model, data=data)
    run = run_trainer(write_config(tmp_path, config), DTRAIN_PROGRESS_SINK=f"jsonl:{progress}")
    assert run.returncode == 0, run.stderr
    events = read_jsonl(progress)
    start = next(e for e in events if e["event"] == "start")
    assert start["lightning"] == package
    assert events[-1]["event"] == "finished" and events[-1]["ok"] and events[-1]["step"] == 4
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 4
    # dtrain's own checkpoint callback, on that package's ModelCheckpoint, wrote it.
    assert any(key.startswith("StepCheckpoint") for key in checkpoint["callbacks"])
    assert (tmp_path / "artifacts" / "model.onnx").is_file()


def test_every_import_style_resolves_to_its_package() -> None:
    class NewStyle(lightning.pytorch.LightningModule):
        pass

    class UnifiedStyle(lightning.LightningModule):
        pass

    class ClassicStyle(pytorch_lightning.LightningModule):
        pass

    for cls, package in ((NewStyle, flavor.LIGHTNING), (UnifiedStyle, flavor.LIGHTNING), (ClassicStyle, flavor.PYTORCH_LIGHTNING)):
        chosen, model_cls, data_cls = flavor.resolve(cls, SyntheticImageDataModule, "m.M", "SyntheticImageDataModule")
        assert chosen.name == package and model_cls is cls
        assert issubclass(data_cls, chosen.LightningDataModule)
        assert data_cls.__name__ == "SyntheticImageDataModule"


def test_builtins_follow_the_users_package() -> None:
    class ClassicData(pytorch_lightning.LightningDataModule):
        pass

    chosen, model_cls, _ = flavor.resolve(ImageClassifier, ClassicData, "ImageClassifier", "m.D")
    assert chosen.name == flavor.PYTORCH_LIGHTNING
    assert issubclass(model_cls, pytorch_lightning.LightningModule)
    assert not issubclass(model_cls, lightning.pytorch.LightningModule)
    model = model_cls(arch="resnet18", num_classes=3)
    assert model.hparams["arch"] == "resnet18" and model.num_classes == 3
    # Both built-in: lightning, the classes as they are.
    assert flavor.resolve(ImageClassifier, SyntheticImageDataModule, "a.A", "b.B")[1:] == (
        ImageClassifier,
        SyntheticImageDataModule,
    )


def test_a_model_and_data_on_different_packages_is_an_error_naming_both() -> None:
    class ClassicModel(pytorch_lightning.LightningModule):
        pass

    class NewData(lightning.pytorch.LightningDataModule):
        pass

    with pytest.raises(flavor.ConfigError) as error:
        flavor.resolve(ClassicModel, NewData, "mypkg.ClassicModel", "mypkg.NewData")
    message = str(error.value)
    assert "mypkg.ClassicModel is built on pytorch_lightning" in message
    assert "mypkg.NewData on lightning.pytorch" in message


@pytest.mark.parametrize("data", [SyntheticImageDataModule, ImageFolderDataModule, DigitsDataModule],
                         ids=lambda cls: cls.__name__)
def test_every_builtin_data_module_follows_a_pytorch_lightning_model(data: type) -> None:
    """A LitModel written `import pytorch_lightning as pl` trains on any built-in data (docs/models.md)."""

    class ClassicModel(pytorch_lightning.LightningModule):
        pass

    chosen, _, data_cls = flavor.resolve(ClassicModel, data, "mypkg.ClassicModel", data.__name__)
    assert chosen.name == flavor.PYTORCH_LIGHTNING
    assert issubclass(data_cls, pytorch_lightning.LightningDataModule) and data_cls.__name__ == data.__name__


def test_the_digits_on_pytorch_lightning_give_their_validation_batches() -> None:
    digits_cls = flavor.rebased(DigitsDataModule, flavor.PYTORCH_LIGHTNING, "LightningDataModule")
    digits = digits_cls(image_size=8, batch_size=16)
    digits.setup("fit")
    images, labels = next(iter(digits.val_dataloader()))
    assert images.shape == (16, 3, 8, 8) and labels.shape == (16,)
