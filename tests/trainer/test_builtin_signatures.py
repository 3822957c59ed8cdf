"""The API layer's table of the built-in classes' arguments (api.builtin_classes), which `dtrain validate` checks
initArgs against, is the classes' own signatures: a changed argument fails here, not in a user's pod. docs/models.md's
tables of them are generated from the same signatures and the classes' docstrings, and are the committed ones."""

from __future__ import annotations

import inspect
from pathlib import Path

import lightning as L
import pytest

from dtrain_common.loading import import_class
from dtrain_operator.api.builtin_classes import BUILTIN_ALIASES, BUILTIN_SIGNATURES, Signature
from dtrain_trainer import data, digits, models
from tools.builtin_classes_doc import DOCUMENTED, with_section

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


def test_every_built_in_class_is_documented() -> None:
    assert sorted(DOCUMENTED) == sorted(BUILTIN_SIGNATURES)


def test_the_models_guide_has_the_generated_tables() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    assert with_section(page) == page, "docs/models.md's initArgs tables are stale: run `make manifests`"
