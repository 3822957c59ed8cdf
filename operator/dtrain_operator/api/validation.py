"""Validate job files: a file of one YAML document in, a DistributedTraining or a few lines of errors out.

`dtrain validate`, `dtrain submit`, `dtrain run` and the operator (InvalidSpec) check and
report through the same functions, so a file is refused (and said to be) the same way
wherever it is checked. Every line is escaped and capped: whatever a file holds, the answer
is a screenful of plain text.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from dtrain_operator import api
from dtrain_operator.api import contract
from dtrain_operator.api.job_defaults import JobDefaults, JobDefaultsError
from dtrain_operator.api.kube_objects import FIELD_ERROR
from dtrain_operator.api.redaction import REDACTED, is_credential_name, redact_text
from dtrain_operator.api.safe_yaml import (
    YamlRefused,
    echo,
    key_path,
    load_documents,
    printable,
    read_job_file,
    shortened,
)

# Lines one file's errors print before the rest are counted: a screenful, whatever the file holds.
MAX_ERROR_LINES = 10
# One line's length: a path, what is wrong and the way out, each echoed part shortened already.
MAX_LINE_CHARACTERS = 1000
# All of one job's messages together, in UTF-8 (a line of non-ASCII characters is up to 4 bytes each): they
# go into a condition, an Event and a terminal. Under 16 KiB with the line that counts what was left out.
MAX_MESSAGES_BYTES = 15 * 1024
# The exit code of `dtrain validate`, `submit` and `run` for an invalid job file (argparse's for bad usage).
EXIT_INVALID_JOB = 2
from dtrain_operator.api.job_dirs import missing_shared_storage
from dtrain_operator.api.record_room import room_problem


@dataclass
class DocumentResult:
    """A job file or object: the parsed job, or the errors that stop it."""

    source: str
    job: api.DistributedTraining | None = None
    errors: list[str] = field(default_factory=list)
    document: Any = None
    """The object as it was read (what `dtrain submit` sends to the API server)."""


def _field_names(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _unwrap(annotation: Any) -> Any:
    """`annotation` without Annotated's metadata and without the `| None` of an optional field."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if _is_union(annotation) and len(members) == 1:
        return _unwrap(members[0])
    return annotation


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _walk(loc: tuple[Any, ...], root: type[BaseModel]) -> tuple[str, Any]:
    """The path that `loc` stands for, as the user wrote it, and the type found there (None past
    what the model knows). Pydantic's own parts are left out: a union branch's name
    (`constrained-int`) and the `[key]` it adds to an error in a map's key."""
    text, after_key = "", False
    annotation: Any = root
    for part in loc:
        annotation = _unwrap(annotation)
        if after_key and part == "[key]":
            after_key = False
            continue
        after_key = False
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = next((f for n, f in annotation.model_fields.items() if (f.alias or n) == part), None)
            annotation = field.annotation if field else None
        elif typing.get_origin(annotation) is dict:
            annotation, after_key = typing.get_args(annotation)[1], True
        elif typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        elif _is_union(annotation):
            annotation = _first_model(annotation)
            continue
        else:
            annotation = None
        text = f"{text}[{part}]" if isinstance(part, int) else key_path(text, part)
    return text, annotation


def _model_at(loc: tuple[Any, ...], root: type[BaseModel] = api.DistributedTraining) -> type[BaseModel] | None:
    """The pydantic model that holds the field at `loc` (for "did you mean" hints)."""
    _, annotation = _walk(loc, root)
    annotation = _unwrap(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _path(loc: tuple[Any, ...], root: type[BaseModel] = api.DistributedTraining) -> str:
    return _walk(loc, root)[0] or "(document)"


def _may_hold_a_secret(loc: tuple[Any, ...]) -> bool:
    """A value under a credential-like key, or any env value: never echoed."""
    if any(isinstance(part, str) and is_credential_name(part) for part in loc):
        return True
    return "env" in loc and loc[-1] == "value"


def format_error(
    error: ErrorDetails, root: type[BaseModel] = api.DistributedTraining, listed: set[str] | None = None
) -> str:
    """One pydantic error as `field.path: what is wrong; what is allowed`. An unknown field's line lists
    the known ones only the first time for each parent that `listed` records."""
    loc = tuple(error["loc"])
    kind = error["type"]
    path = _path(loc, root)
    if kind == FIELD_ERROR:
        context = error.get("ctx", {})
        return f"{path if loc else ''}{context['path']}: {context['message']}"
    if kind == "extra_forbidden":
        return f"{path}: unknown field{_known_fields_hint(loc, root, listed)}"
    if kind == "missing":
        return f"{path}: required field is missing"
    # Only the lines below echo the value (and read every key of its path to know whether they may).
    value = REDACTED if _may_hold_a_secret(loc) else error.get("input")
    if kind in ("literal_error", "enum"):
        expected = error.get("ctx", {}).get("expected", "")
        return f"{path}: {echo(value)} is not allowed; use one of {expected}"
    message = redact_text(error["msg"])
    message = message.removeprefix("Value error, ")
    if kind in ("model_type", "dict_type", "list_type") or value is None or isinstance(value, (dict, list)):
        return f"{path}: {message}"
    # The value too: a URL may carry user:password@ (s3://key:secret@bucket).
    return f"{path}: {message} (got {redact_text(echo(value))})"


def _known_fields_hint(loc: tuple[Any, ...], root: type[BaseModel], listed: set[str] | None) -> str:
    parent = _model_at(loc[:-1], root)
    known = _field_names(parent) if parent else []
    key = str(loc[-1])
    # A key over 7/3 times as long as the longest name cannot reach difflib's cutoff (a ratio of 0.6): no need
    # to read a 400 KB key to know it (3 times, to stay clear of the bound).
    close = bool(known) and len(key) <= 3 * max(map(len, known))
    hint = difflib.get_close_matches(key, known, n=1) if close else []
    if hint:
        return f"; did you mean '{hint[0]}'?"
    parent_path = _path(loc[:-1], root)
    if not known or (listed is not None and parent_path in listed):
        return ""
    if listed is not None:
        listed.add(parent_path)
    return f"; known fields: {', '.join(known)}"


def format_validation_error(
    exc: ValidationError, root: type[BaseModel] = api.DistributedTraining, limit: int = MAX_ERROR_LINES
) -> list[str]:
    """One line per field in error, at most `limit` of them, then how many more there are: a file with
    thousands of unknown keys gets a short answer, in time linear in their number."""
    lines: list[str] = []
    paths: set[str] = set()
    listed: set[str] = set()
    unknown_left = other_left = 0
    for error in exc.errors():
        path = _path(tuple(error["loc"]), root)
        # A union reports one error per branch; one line per field is enough.
        if path in paths:
            continue
        paths.add(path)
        if len(lines) < limit:
            lines.append(format_error(error, root, listed))
        elif error["type"] == "extra_forbidden":
            unknown_left += 1
        else:
            other_left += 1
    if unknown_left and not other_left:
        lines.append(f"... and {unknown_left:,} more unknown fields")
    elif unknown_left or other_left:
        lines.append(f"... and {unknown_left + other_left:,} more errors")
    return lines


def _without_nulls(value: Any, annotation: Any) -> Any:
    """`value` without the nulls the API server drops before it validates: a field or a map value the
    schema types, left null when its content was commented out (`trainer:` with only comments).
    Free-form values (initArgs, volumes) keep theirs, as the API server does; an unknown field keeps
    its null, to be named as unknown."""
    annotation = _unwrap(annotation)
    if isinstance(value, dict) and isinstance(annotation, type) and issubclass(annotation, BaseModel):
        fields = {f.alias or name: f.annotation for name, f in annotation.model_fields.items()}
        return {k: _without_nulls(v, fields.get(k)) for k, v in value.items() if k not in fields or v is not None}
    if isinstance(value, dict) and typing.get_origin(annotation) is dict:
        item = typing.get_args(annotation)[1]
        if _unwrap(item) is Any:
            return value
        return {k: _without_nulls(v, item) for k, v in value.items() if v is not None}
    if isinstance(value, list) and typing.get_origin(annotation) is list:
        item = typing.get_args(annotation)[0]
        return [_without_nulls(v, item) for v in value]
    return value


def bounded_messages(lines: list[str]) -> list[str]:
    """`lines`, each printable and at most MAX_LINE_CHARACTERS long, as many as MAX_MESSAGES_BYTES hold, then
    how many more there were: whatever a job holds, its messages fit a condition and a screen."""
    kept: list[str] = []
    size = 0
    for index, line in enumerate(lines):
        line = shortened(printable(line), MAX_LINE_CHARACTERS)
        size += len(line.encode("utf-8", "surrogatepass")) + 1
        if size > MAX_MESSAGES_BYTES:
            kept.append(f"... and {len(lines) - index:,} more errors (left out: one job's messages stop at "
                        f"{MAX_MESSAGES_BYTES // 1024} KiB)")
            break
        kept.append(line)
    return kept


def validate_object(obj: Any, source: str = "", cluster: bool = True) -> DocumentResult:
    """Check one already-parsed object: a stored one, as the operator reads it, or one a user gives to be created (a
    job file, a dict); `cluster`: also what only a cluster needs (shared storage)."""
    result = _checked_object(obj, source, cluster)
    result.errors = bounded_messages(result.errors)
    return result


def _checked_object(obj: Any, source: str, cluster: bool) -> DocumentResult:
    result = DocumentResult(source=source, document=obj)
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
        result.job = api.DistributedTraining.model_validate(_without_nulls(obj, api.DistributedTraining), strict=True)
    except ValidationError as exc:
        result.errors.extend(format_validation_error(exc))
    if cluster and result.job is not None:
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        problem = room_problem(result.job.spec, annotations) or missing_shared_storage(
            result.job.spec, result.job.namespace, result.job.name
        )
        if problem:
            result.errors.append(problem)
            result.job = None
    return result


def validate_text(
    text: str, source: str, cluster: bool = True, defaults: JobDefaults | None = None, namespace: str = "default"
) -> DocumentResult:
    """The one DistributedTraining of a YAML text; YAML syntax errors, hostile YAML, empty files and files
    with several documents are errors too (`dtrain validate`, `submit` and `run` take one job per file)."""
    try:
        documents = load_documents(text)
    except YamlRefused as exc:
        where = f"{source}:{exc.line}:{exc.column}" if exc.line else source
        return DocumentResult(source=where, errors=[printable(str(exc))])
    if not documents:
        return DocumentResult(source=source, errors=["the file holds no YAML document"])
    if len(documents) > 1:
        return DocumentResult(
            source=source, errors=[f"holds {len(documents)} YAML documents; give one DistributedTraining per file"]
        )
    return validate_object(defaults.fill(documents[0], namespace) if defaults else documents[0], source, cluster)


def validate_file(
    path: str | Path, cluster: bool = True, defaults: JobDefaults | None = None, namespace: str = "default"
) -> DocumentResult:
    """One job file; with `defaults`, filled as the operator fills it in its namespace (or `namespace`)."""
    source = printable(str(path))
    try:
        text = read_job_file(path)
    except YamlRefused as exc:
        return DocumentResult(source=source, errors=[str(exc)])
    return validate_text(text, source, cluster, defaults, namespace)


def _checked_defaults(where: str, partial: Any, namespace: str) -> dict[str, Any]:
    """One part of the job defaults, checked as a job's spec is (nothing it may not hold, every value valid)."""
    if not isinstance(partial, dict):
        raise JobDefaultsError(f"{where}: expected a mapping of spec fields, got {type(partial).__name__}")
    document = {"apiVersion": contract.API_VERSION, "kind": contract.KIND,
                "metadata": {"name": "job-defaults", "namespace": namespace}, "spec": partial}
    errors = validate_object(document, cluster=False).errors
    if errors:
        raise JobDefaultsError("; ".join(
            line.replace("spec", where, 1) if line.startswith("spec") else f"{where}: {line}"
            for line in errors[:MAX_ERROR_LINES]
        ))
    return partial


def parse_job_defaults(text: str, source: str = "job defaults") -> JobDefaults:
    """Job defaults from YAML (`{spec: {...}, namespaces: {NS: {...}}}`, the chart's jobDefaults), or
    JobDefaultsError naming the field and what is wrong with it."""
    try:
        documents = load_documents(text)
    except YamlRefused as exc:
        raise JobDefaultsError(f"{source}: {exc}") from exc
    data = documents[0] if documents else None
    if data is None:
        return JobDefaults()
    if not isinstance(data, dict) or set(data) - {"spec", "namespaces"}:
        raise JobDefaultsError(f"{source}: expected a mapping with spec and namespaces (each optional)")
    spec = _checked_defaults("jobDefaults.spec", data.get("spec") or {}, "default")
    namespaces = data.get("namespaces") or {}
    if not isinstance(namespaces, dict):
        raise JobDefaultsError(f"{source}: namespaces: expected a mapping of namespace to spec fields")
    defaults = JobDefaults(spec=spec, namespaces={str(ns): partial or {} for ns, partial in namespaces.items()})
    for namespace in defaults.namespaces:
        _checked_defaults(f"jobDefaults.namespaces.{namespace}", defaults.for_namespace(namespace), namespace)
    return defaults


def load_job(path: str | Path) -> tuple[api.DistributedTraining | None, list[str]]:
    """The DistributedTraining of a job file, or `source: error` lines, for `dtrain run`: its nodes share
    this machine's disk, so what only a cluster needs (shared storage) is not asked for."""
    result = validate_file(path, cluster=False)
    return result.job, [f"{result.source}: {error}" for error in result.errors]
