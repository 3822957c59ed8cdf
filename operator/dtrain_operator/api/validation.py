"""Validate job files: YAML documents in, DistributedTraining objects or one line per error out.

`dtrain validate`, `dtrain run` and the operator (InvalidSpec) report errors through
the same functions, so a user sees the same message wherever the spec is checked.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from dtrain_operator import api
from dtrain_operator.api import contract
from dtrain_operator.api.redaction import REDACTED, is_credential_name, redact_text
from dtrain_operator.api.safe_yaml import YamlRefused, echo, load_documents
from dtrain_operator.api.storage import missing_shared_storage


@dataclass
class DocumentResult:
    """One YAML document of a file: the parsed job, or the errors that stop it."""

    source: str
    job: api.DistributedTraining | None = None
    errors: list[str] = field(default_factory=list)


def _field_names(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _model_at(loc: tuple[Any, ...], root: type[BaseModel] = api.DistributedTraining) -> type[BaseModel] | None:
    """The pydantic model that holds the field at `loc` (for "did you mean" hints)."""
    model: type[BaseModel] = root
    for part in loc:
        if isinstance(part, int):
            continue
        match = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if match is None:
            return None
        inner = _first_model(match.annotation)
        if inner is None:
            return None
        model = inner
    return model


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _path(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part in ("function-after", "function-before") or "[" in str(part):
            continue  # pydantic's names for validator and union branches, not fields
        else:
            text += f".{part}" if text else str(part)
    return text or "(document)"


def _may_hold_a_secret(loc: tuple[Any, ...]) -> bool:
    """A value under a credential-like key, or any env value: never echoed."""
    if any(isinstance(part, str) and is_credential_name(part) for part in loc):
        return True
    return "env" in loc and loc[-1] == "value"


def format_error(error: ErrorDetails, root: type[BaseModel] = api.DistributedTraining) -> str:
    """One pydantic error as `field.path: what is wrong; what is allowed`."""
    loc = tuple(error["loc"])
    kind = error["type"]
    value = error.get("input")
    path = _path(loc)
    if _may_hold_a_secret(loc):
        value = REDACTED
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1], root)
        known = _field_names(parent) if parent else []
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
        suggestion = f"; did you mean '{hint[0]}'?" if hint else (f"; known fields: {', '.join(known)}" if known else "")
        return f"{path}: unknown field{suggestion}"
    if kind == "missing":
        return f"{path}: required field is missing"
    if kind in ("literal_error", "enum"):
        expected = error.get("ctx", {}).get("expected", "")
        return f"{path}: {echo(value)} is not allowed; use one of {expected}"
    message = redact_text(error["msg"])
    message = message.removeprefix("Value error, ")
    if kind in ("model_type", "dict_type", "list_type") or value is None or isinstance(value, (dict, list)):
        return f"{path}: {message}"
    # The value too: a URL may carry user:password@ (s3://key:secret@bucket).
    return f"{path}: {message} (got {redact_text(echo(value))})"


def format_validation_error(exc: ValidationError, root: type[BaseModel] = api.DistributedTraining) -> list[str]:
    lines: list[str] = []
    for error in exc.errors():
        line = format_error(error, root)
        # A union reports one error per branch; one line per field is enough.
        if not any(existing.split(":")[0] == line.split(":")[0] for existing in lines):
            lines.append(line)
    return lines


def validate_object(obj: Any, source: str = "", cluster: bool = True) -> DocumentResult:
    """Check one already-parsed document; `cluster`: also what only a cluster needs (shared storage)."""
    result = DocumentResult(source=source)
    if not isinstance(obj, dict):
        result.errors.append(f"expected a mapping (a Kubernetes object), got {type(obj).__name__}")
        return result
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if kind != contract.KIND:
        result.errors.append(f"kind: expected {contract.KIND}, got {echo(kind)}")
    if api_version != contract.API_VERSION:
        result.errors.append(f"apiVersion: expected {contract.API_VERSION}, got {echo(api_version)}")
    if result.errors:
        return result
    try:
        # Strict, as the API server is: "2" is not an integer, true is not 1, "no" is not false.
        result.job = api.DistributedTraining.model_validate(obj, strict=True)
    except ValidationError as exc:
        result.errors.extend(format_validation_error(exc))
    if cluster and result.job is not None:
        problem = missing_shared_storage(result.job.spec, result.job.namespace, result.job.name)
        if problem:
            result.errors.append(problem)
            result.job = None
    return result


def validate_text(text: str, source: str, cluster: bool = True) -> list[DocumentResult]:
    """Every document of a YAML text; YAML syntax errors, hostile YAML and empty files are errors too."""
    try:
        documents = load_documents(text)
    except YamlRefused as exc:
        where = f"{source}:{exc.line}:{exc.column}" if exc.line else source
        return [DocumentResult(source=where, errors=[str(exc)])]
    if not documents:
        return [DocumentResult(source=source, errors=["the file holds no YAML document"])]
    many = len(documents) > 1
    return [validate_object(doc, f"{source}#{i + 1}" if many else source, cluster) for i, doc in enumerate(documents)]


def validate_file(path: str | Path, cluster: bool = True) -> list[DocumentResult]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        return [DocumentResult(source=str(path), errors=[f"cannot read the file: {exc.strerror}"])]
    except UnicodeDecodeError:
        return [DocumentResult(source=str(path), errors=["not a text (UTF-8) file"])]
    return validate_text(text, str(path), cluster)


def load_job(path: str | Path) -> tuple[api.DistributedTraining | None, list[str]]:
    """The single DistributedTraining of a job file, or `source: error` lines, for `dtrain run`: its nodes share
    this machine's disk, so what only a cluster needs (shared storage) is not asked for."""
    results = validate_file(path, cluster=False)
    errors = [f"{r.source}: {e}" for r in results for e in r.errors]
    if errors:
        return None, errors
    if len(results) != 1:
        return None, [f"{path}: holds {len(results)} DistributedTrainings; give a file with one"]
    return results[0].job, []
