"""The model and the data module from `classPath` + `initArgs`, LightningCLI's shape.

A user's own LightningModule or LightningDataModule is anything importable in the image
(or on PYTHONPATH locally). Every way of getting it wrong - a module that does not
import, a name that is not there, a class of the wrong kind, arguments the class does
not take - ends in one ConfigError line that names the field.
"""

from __future__ import annotations

from typing import Any

from dtrain_common.loading import import_class, instantiate
from dtrain_operator import api
from dtrain_trainer import flavor


def job_classes(model: api.ClassSpec, data: api.ClassSpec) -> tuple[flavor.Flavor, type, type]:
    """The Lightning package a job trains with, and its model and data classes on that package."""
    return flavor.resolve(
        import_class(model.class_path, "model"), import_class(data.class_path, "data"), model.class_path, data.class_path
    )


def instantiate_data(
    spec: api.ClassSpec, pl: flavor.Flavor, cls: type, batch_size: int, num_workers: int
) -> Any:
    """The data module, given the batch size and loader workers the trainer passes it."""
    return instantiate(
        spec,
        "data",
        pl.LightningDataModule,
        cls=cls,
        supplied={"batch_size": (batch_size, "trainer.batchSize"), "num_workers": (num_workers, "trainer.numWorkers")},
    )
