"""docs/api.md is generated from the model (`dtrain api-docs`), names every field, and is up to date."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pydantic

from dtrain_operator import api
from dtrain_operator.api.reference import api_reference

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_committed_api_reference_equals_a_fresh_generation() -> None:
    assert API_MD.read_text() == api_reference(), "docs/api.md drifted from the model: run `make manifests`"


def _model_fields(model: type[pydantic.BaseModel], path: str, seen: set[type]) -> set[str]:
    """Every field of a model and of the models it holds, as section path + field name."""
    found: set[str] = set()
    seen = seen | {model}
    for name, info in model.model_fields.items():
        wire = info.alias or name
        found.add(f"{path} {wire}")
        for inner in _models_in(info.annotation):
            if inner not in seen:
                found |= _model_fields(inner, f"{path}.{wire}", seen)
    return found


def _models_in(annotation: Any) -> list[type[pydantic.BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models_in(arg)]


def _documented_fields(text: str) -> set[str]:
    """`section field` for every row of every table, section paths without [] and .* markers."""
    found, section = set(), ""
    for line in text.splitlines():
        heading = re.match(r"## `([^`]+)`", line)
        if heading:
            section = heading.group(1).replace("[]", "").replace(".*", "")
        row = re.match(r"\| `([^`]+)`", line)
        if row:
            found.add(f"{section} {row.group(1)}")
    return found


def test_every_field_of_the_model_is_documented() -> None:
    documented = _documented_fields(api_reference())
    for root, model in (("spec", api.DistributedTrainingSpec), ("status", api.DistributedTrainingStatus)):
        missing = sorted(_model_fields(model, root, set()) - documented)
        assert not missing, f"fields of the model missing from docs/api.md: {missing}"


def test_a_row_gives_type_default_bounds_and_description() -> None:
    rows = [line for line in api_reference().splitlines() if line.startswith("| `nodes` ")]
    assert rows[0] == "| `nodes` | integer | `1` | >= 1; <= 4096 | Number of worker pods (one per machine). |"
    assert "| `env` | [array of object](#specenv) |  | items <= 256 |" in api_reference()
