"""The API layer's table of the built-in classes' arguments (api.builtin_classes), which `dtrain validate` checks
initArgs against, is the classes' own signatures: a changed argument fails here, not in a user's pod."""

from __future__ import annotations

import inspect

import lightning as L
import pytest

from dtrain_common.loading import import_class
from dtrain_operator.api.builtin_classes import BUILTIN_ALIASES, BUILTIN_SIGNATURES, Signature
from dtrain_trainer import data, digits, models

BUILTIN_MODULES = (models, data, digits)


def signature_of(cls: type) -> Signature:
    parameters = inspect.signature(cls).parameters.values()
    named = [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return Signature(
        arguments=tuple(p.name for p in named),
        required=tuple(p.name for p in named if p.default is p.empty),
        takes_any=any(p.kind is p.VAR_KEYWORD for p in parameters),
    )


@pytest.mark.parametrize("class_path", sorted(BUILTIN_SIGNATURES))
def test_the_table_is_the_class_signature(class_path: str) -> None:
    assert BUILTIN_SIGNATURES[class_path] == signature_of(import_class(class_path, "model"))


def test_every_built_in_class_is_in_the_table() -> None:
    lightning_bases = (L.LightningModule, L.LightningDataModule)
    found = {
        f"{module.__name__}.{name}"
        for module in BUILTIN_MODULES
        for name, value in vars(module).items()
        if inspect.isclass(value) and value.__module__ == module.__name__ and issubclass(value, lightning_bases)
    }
    assert found == set(BUILTIN_SIGNATURES)


def test_every_bare_name_is_a_built_in() -> None:
    assert set(BUILTIN_ALIASES.values()) <= set(BUILTIN_SIGNATURES)
