"""The Lightning package a job trains with, and its model and data classes on that package.

Importing and building a class from `classPath` + `initArgs` is dtrain_common.loading,
which the engine builder shares; this is the trainer's use of it.
"""

from __future__ import annotations

from typing import Any

from dtrain_common.loading import import_class, instantiate
from dtrain_operator import api
from dtrain_operator.api.builtin_classes import TRAINER_DATA_ARGUMENTS
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
    values = {"batch_size": batch_size, "num_workers": num_workers}
    supplied = {name: (values[name], source) for name, source in TRAINER_DATA_ARGUMENTS.items()}
    return instantiate(spec, "data", pl.LightningDataModule, cls=cls, supplied=supplied)
