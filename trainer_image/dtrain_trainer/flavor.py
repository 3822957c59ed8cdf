"""Which Lightning package a job trains with: `lightning` (`lightning.pytorch`) or `pytorch_lightning`.

The two distributions ship the same code under two package names, and each one's Trainer
accepts only its own LightningModule, LightningDataModule and callbacks. A model written
`import pytorch_lightning as pl` (the classic tutorials, the design's article) and one
written `import lightning as L` or `import lightning.pytorch as pl` both train: the
Trainer, its strategy, logger and dtrain's callbacks come from the package the user's
classes are built on. dtrain's built-in model and data modules adapt to either package;
two user classes built on different packages are a ConfigError that names both.
"""

from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from dtrain_common.errors import ConfigError

LIGHTNING = "lightning.pytorch"
PYTORCH_LIGHTNING = "pytorch_lightning"
PACKAGES = (LIGHTNING, PYTORCH_LIGHTNING)
# How a user imports each package, for messages.
IMPORT_STYLE = {LIGHTNING: "import lightning as L (or lightning.pytorch)", PYTORCH_LIGHTNING: "import pytorch_lightning as pl"}
# A built-in class sets this to the class holding its behaviour (a plain mixin without a
# Lightning base), so that `rebased` can put the same behaviour on the other package's base.
BEHAVIOUR_ATTRIBUTE = "_dtrain_behaviour"


@dataclass(frozen=True)
class Flavor:
    """One of the two Lightning packages, imported."""

    name: str
    module: ModuleType

    def __getattr__(self, item: str) -> Any:
        # Trainer, LightningModule, LightningDataModule, Callback, seed_everything, ...
        return getattr(self.module, item)

    @property
    def callbacks(self) -> ModuleType:
        return importlib.import_module(f"{self.name}.callbacks")

    @property
    def strategies(self) -> ModuleType:
        return importlib.import_module(f"{self.name}.strategies")

    @property
    def plugins(self) -> ModuleType:
        return importlib.import_module(f"{self.name}.plugins")

    @property
    def loggers(self) -> ModuleType:
        return importlib.import_module(f"{self.name}.loggers")

    @property
    def profilers(self) -> ModuleType:
        return importlib.import_module(f"{self.name}.profilers")


@functools.cache
def flavor(name: str) -> Flavor:
    try:
        return Flavor(name, importlib.import_module(name))
    except ImportError as exc:
        distribution = "pytorch-lightning" if name == PYTORCH_LIGHTNING else "lightning"
        raise ConfigError(f"the {name} package is not installed ({exc}); pip install {distribution}") from None


@functools.cache
def callback_class(package: str, behaviour: type, on_lightning: type) -> type:
    """A callback of `package` (lightning.pytorch or pytorch_lightning): `on_lightning` (the `behaviour` mixin on
    lightning.pytorch's Callback) itself, else the same mixin on pytorch_lightning's Callback, under its name."""
    if package == LIGHTNING:
        return on_lightning
    return type(on_lightning.__name__, (behaviour, flavor(package).Callback), {"__module__": on_lightning.__module__})


def package_of(cls: type, base_name: str) -> str | None:
    """The Lightning package whose `base_name` (LightningModule, LightningDataModule) `cls` subclasses, if any.

    Only packages already imported are asked: a class cannot subclass a package its module never imported.
    """
    for name in PACKAGES:
        module = sys.modules.get(name)
        base = getattr(module, base_name, None) if module is not None else None
        if isinstance(base, type) and issubclass(cls, base):
            return name
    return None


def is_builtin(cls: type) -> bool:
    return BEHAVIOUR_ATTRIBUTE in vars(cls)


@functools.cache
def rebased(cls: type, package: str, base_name: str) -> type:
    """`cls` (a built-in) on `package`'s `base_name`: the same behaviour, names and docs."""
    if package_of(cls, base_name) == package:
        return cls
    behaviour = vars(cls)[BEHAVIOUR_ATTRIBUTE]
    base = getattr(flavor(package).module, base_name)
    namespace = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        BEHAVIOUR_ATTRIBUTE: behaviour,
    }
    return type(cls.__name__, (behaviour, base), namespace)


def _check_kind(cls: type, class_path: str, field: str, base_name: str) -> str | None:
    package = package_of(cls, base_name)
    if package is None:
        raise ConfigError(
            f"{field}.classPath: {class_path} is not a {base_name} subclass "
            f"(of lightning.pytorch or pytorch_lightning)"
        )
    return None if is_builtin(cls) else package


def resolve(model_cls: type, data_cls: type, model_path: str, data_path: str) -> tuple[Flavor, type, type]:
    """The package to train with, and the model and data classes on it.

    The user's classes decide; built-ins follow them (both built-in: lightning).
    """
    model_package = _check_kind(model_cls, model_path, "model", "LightningModule")
    data_package = _check_kind(data_cls, data_path, "data", "LightningDataModule")
    if model_package and data_package and model_package != data_package:
        raise ConfigError(
            f"model.classPath {model_path} is built on {model_package} ({IMPORT_STYLE[model_package]}) but "
            f"data.classPath {data_path} on {data_package} ({IMPORT_STYLE[data_package]}); one job trains "
            "with one Lightning package: build both classes on the same one"
        )
    package = model_package or data_package or LIGHTNING
    chosen = flavor(package)
    if is_builtin(model_cls):
        model_cls = rebased(model_cls, package, "LightningModule")
    if is_builtin(data_cls):
        data_cls = rebased(data_cls, package, "LightningDataModule")
    return chosen, model_cls, data_cls
