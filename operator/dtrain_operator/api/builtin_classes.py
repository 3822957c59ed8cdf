"""The trainer's built-in model and data classes, and the keyword arguments each one takes.

An initArgs key that a class does not take fails only in the pod, once the trainer builds the class. The
project knows its own classes, so `dtrain validate` refuses such a key for them first; a user's own class
is the trainer's to check. The API layer may not import the trainer (it needs torch), so the arguments are
written out here, and tests/trainer/test_builtin_signatures.py checks them against the classes' signatures.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dtrain_operator.api.kube_objects import Problem
from dtrain_operator.api.safe_yaml import echo, key_step

BUILTIN_MODEL: Final = "dtrain_trainer.models.ImageClassifier"
BUILTIN_SYNTHETIC_DATA: Final = "dtrain_trainer.data.SyntheticImageDataModule"
BUILTIN_IMAGE_FOLDER_DATA: Final = "dtrain_trainer.data.ImageFolderDataModule"
BUILTIN_DIGITS_DATA: Final = "dtrain_trainer.digits.DigitsDataModule"
# Bare names a classPath may use for these built-ins, e.g. `classPath: ImageClassifier`.
BUILTIN_ALIASES: Final = {
    path.rsplit(".", 1)[1]: path for path in (BUILTIN_MODEL, BUILTIN_SYNTHETIC_DATA, BUILTIN_IMAGE_FOLDER_DATA)
}
# The data module's arguments that the trainer passes itself, to any data class that names them, and the fields
# they come from: initArgs may not set them as well.
TRAINER_DATA_ARGUMENTS: Final = {"batch_size": "trainer.batchSize", "num_workers": "trainer.numWorkers"}


@dataclass(frozen=True)
class Signature:
    """The keyword arguments of a class's constructor."""

    arguments: tuple[str, ...]
    """Every argument it takes by name, in order."""
    required: tuple[str, ...] = ()
    """Those without a default."""
    takes_any: bool = False
    """Whether it takes **kwargs too (any name)."""


_SYNTHETIC_AND_DIGITS_LOADERS = ("seed", "batch_size", "num_workers", "pin_memory")
BUILTIN_SIGNATURES: Final = {
    BUILTIN_MODEL: Signature((
        "arch", "num_classes", "optimizer", "lr", "weight_decay", "momentum", "lr_schedule", "label_smoothing",
    )),
    BUILTIN_SYNTHETIC_DATA: Signature((
        "image_size", "channels", "num_classes", "num_samples", "pool_size", *_SYNTHETIC_AND_DIGITS_LOADERS,
    )),
    BUILTIN_IMAGE_FOLDER_DATA: Signature(
        ("train_dir", "val_dir", "image_size", "batch_size", "num_workers", "pin_memory", "persistent_workers"),
        required=("train_dir",),
    ),
    BUILTIN_DIGITS_DATA: Signature(("image_size", "channels", "val_fraction", *_SYNTHETIC_AND_DIGITS_LOADERS)),
}


def init_args_problem(class_path: str, init_args: Mapping[str, Any], passed: Mapping[str, str]) -> Problem | None:
    """What the class of `class_path` would refuse in `init_args`, as far as the API layer knows (its built-ins);
    `passed`: the arguments the trainer passes itself, and the field each comes from."""
    for name, source in passed.items():
        if name in init_args:
            return f".initArgs{key_step(name)}", f"set {source} instead; the trainer passes it to the class"
    full_path = BUILTIN_ALIASES.get(class_path, class_path)
    signature = BUILTIN_SIGNATURES.get(full_path)
    if signature is None or signature.takes_any:
        return None
    class_name = full_path.rsplit(".", 1)[1]
    settable = [name for name in signature.arguments if name not in passed]
    for key in init_args:
        if key not in signature.arguments:
            hint = difflib.get_close_matches(key, settable, n=1)
            suggestion = f"did you mean '{hint[0]}'? " if hint else ""
            return f".initArgs{key_step(key)}", (
                f"{class_name} takes no argument {echo(key)}; {suggestion}it takes: {', '.join(settable)}"
            )
    missing = [name for name in signature.required if name not in init_args]
    if missing:
        return ".initArgs", f"{class_name} needs {', '.join(map(echo, missing))}"
    return None
