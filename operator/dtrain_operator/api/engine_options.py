"""`dtrain build-engine`'s build options: the BuildFlag fields of spec.engine, as the command takes them.

Each option's name, default, range and help text are declared once, on EngineSettings. From there
the engine Job's command is written (`to_flags(from_spec(engine))`), the command's parser gets its
flags (`add_flags`, the field descriptions as help), and the engine reads the flags back into the
same model (`from_flags`), so that the two ends cannot drift apart.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from annotated_types import Ge, Le
from pydantic import ValidationError, model_validator
from pydantic.fields import FieldInfo

from dtrain_operator.api.artifacts import BatchSize, BuildFlag, EngineProfile, EngineSettings, InputShapeRange

ShapeBound = Literal["min", "opt", "max"]
SHAPE_BOUNDS: tuple[ShapeBound, ...] = ("min", "opt", "max")
SHAPE_FLAGS = "--min-shapes/--opt-shapes/--max-shapes"
# How a field is written on the command line, from its type.
FlagKind = Literal["switch", "choice", "number", "pairs", "repeated", "profiles"]


class EngineBuildOptions(EngineSettings):
    """spec.engine's build options as `dtrain build-engine` takes them: the same fields and checks, except
    that a batch size left out is the ONNX model's to decide (dtrain_engine's resolve_batch_sizes)."""

    min_batch: Annotated[BatchSize | None, BuildFlag()] = None  # type: ignore[assignment]  # None: the model's
    """Smallest batch size the engine accepts (default 1; a static-batch model: its batch)."""
    max_batch: Annotated[BatchSize | None, BuildFlag()] = None  # type: ignore[assignment]  # None: the model's
    """Largest batch size the engine accepts (default 32, or the larger of --min-batch and --opt-batch; a static-batch model: its batch)."""

    @model_validator(mode="after")
    def _batch_order(self) -> EngineBuildOptions:
        """Overrides spec.engine's check, which orders the sizes with its defaults filled in: the command
        orders the sizes given (check_batch_flags) and again once the model fills the rest in."""
        return self


class BuildFlagError(ValueError):
    """A flag the options model refuses, said as the command line says it."""


# --- What each field is on the command line -------------------------------------------------


def _unwrap(annotation: Any) -> Any:
    """The type under Annotated and `| None`."""
    while True:
        if typing.get_origin(annotation) is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif typing.get_origin(annotation) in (typing.Union, types.UnionType):
            (annotation,) = (arg for arg in typing.get_args(annotation) if arg is not type(None))
        else:
            return annotation


def _bounds(field: FieldInfo) -> tuple[object, object]:
    """The ge/le range of a field, however deep in Annotated and Optional its annotation keeps it."""
    found: dict[str, object] = {}

    def look(items: typing.Iterable[Any]) -> None:
        for item in items:
            if isinstance(item, Ge):
                found.setdefault("ge", item.ge)
            elif isinstance(item, Le):
                found.setdefault("le", item.le)
            elif isinstance(item, FieldInfo):
                look(item.metadata)
            else:
                look(typing.get_args(item))

    look([*field.metadata, field.annotation])
    return found.get("ge"), found.get("le")


def _options() -> Iterator[tuple[str, FieldInfo, str]]:
    """(field name, field, flag) of every build option, in the model's order."""
    for name, field in EngineBuildOptions.model_fields.items():
        marker = next((m for m in field.metadata if isinstance(m, BuildFlag)), None)
        if marker is not None:
            yield name, field, marker.name or "--" + name.replace("_", "-")


def _kind(field: FieldInfo) -> FlagKind:
    kind = _unwrap(field.annotation)
    if kind is bool:
        return "switch"
    if typing.get_origin(kind) is Literal:
        return "choice"
    if kind is int:
        return "number"
    if typing.get_origin(kind) is dict:
        return "pairs"
    if typing.get_origin(kind) is list:
        return "profiles" if _unwrap(typing.get_args(kind)[0]) is EngineProfile else "repeated"
    raise TypeError(f"no command-line form for {field.annotation}")


def _help(field: FieldInfo, extra: str = "") -> str:
    default = "" if field.default is None or isinstance(field.default, bool) else f" (default: {field.default})"
    return (str(field.description).rstrip(".") + extra + default + ".").replace("%", "%%")


# --- The three ends ----------------------------------------------------------------------------


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The build options as flags, with the fields' descriptions as help. A flag left out is None."""
    for name, field, flag in _options():
        kind = _kind(field)
        if kind == "switch":
            parser.add_argument(flag, dest=name, action="store_true", default=None, help=_help(field))
        elif kind == "choice":
            parser.add_argument(flag, dest=name, choices=typing.get_args(_unwrap(field.annotation)), help=_help(field))
        elif kind == "number":
            parser.add_argument(flag, dest=name, type=int, metavar="N", help=_help(field))
        elif kind == "pairs":
            parser.add_argument(flag, dest=name, action="append", metavar="NAME:VALUE",
                                help=_help(field, "; NAME:VALUE pairs, comma-separated or repeated"))
        elif kind == "repeated":
            parser.add_argument(flag, dest=name, action="append", metavar="PATH", help=_help(field, "; repeatable"))
        else:
            for bound in SHAPE_BOUNDS:
                shape_help = InputShapeRange.model_fields[bound].description
                parser.add_argument(
                    f"--{bound}-shapes", dest=f"{bound}_shapes", action="append", metavar="SHAPES",
                    help=f"{shape_help} Per input, e.g. images:1x3x224x224,mask:1x224x224; once per optimisation "
                    f"profile (spec.engine.{name}; trtexec --{bound}Shapes).",
                )


def from_spec(engine: EngineSettings) -> EngineBuildOptions:
    """The options the engine Job builds with: spec.engine's, with its batch sizes where no profiles set the shapes."""
    values = {name: getattr(engine, name) for name, _, _ in _options()}
    if engine.profiles:
        del values["min_batch"], values["opt_batch"], values["max_batch"]
    else:
        values["opt_batch"] = engine.resolved_opt_batch
    return EngineBuildOptions.model_validate(values)


def _shapes_text(profile: EngineProfile, bound: ShapeBound) -> str:
    return ",".join(f"{name}:{'x'.join(map(str, getattr(shapes, bound)))}" for name, shapes in profile.inputs.items())


def to_flags(options: EngineBuildOptions) -> list[str]:
    """The options as flags; one at the command's default adds nothing."""
    flags: list[str] = []
    for name, field, flag in _options():
        value = getattr(options, name)
        if value == field.default:
            continue
        kind = _kind(field)
        if kind == "switch":
            flags.append(flag)
        elif kind in ("choice", "number"):
            flags += [flag, str(value)]
        elif kind == "pairs":
            flags += [flag, ",".join(f"{key}:{item}" for key, item in value.items())]
        elif kind == "repeated":
            flags += [part for item in value for part in (flag, item)]
        else:
            flags += [part for profile in value for bound in SHAPE_BOUNDS
                      for part in (f"--{bound}-shapes", _shapes_text(profile, bound))]
    return flags


def parse_shapes(text: str, flag: str) -> dict[str, list[int]]:
    """trtexec's shape list: `name:1x3x224x224,other:1x128` (the last ':' separates the name)."""
    shapes: dict[str, list[int]] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        name, separator, dims = item.rpartition(":")
        try:
            shape = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            shape = []
        if not separator or not name or not shape or min(shape) < 1:
            raise BuildFlagError(f"{flag} {text}: write each input as NAME:DxDxD with sizes of at least 1, e.g. images:1x3x224x224")
        shapes[name] = shape
    return shapes


def _where(index: int) -> str:
    return f"profile {index} ({SHAPE_FLAGS} occurrence {index + 1})"


def _profiles(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    given = {bound: getattr(args, f"{bound}_shapes", None) or [] for bound in SHAPE_BOUNDS}
    if len({len(texts) for texts in given.values()}) > 1:
        raise BuildFlagError(
            "give --min-shapes, --opt-shapes and --max-shapes once per optimisation profile each, got "
            + ", ".join(f"--{bound}-shapes x{len(texts)}" for bound, texts in given.items())
        )
    profiles = []
    for index, texts in enumerate(zip(*given.values())):
        parsed = [parse_shapes(text, f"--{bound}-shapes") for text, bound in zip(texts, SHAPE_BOUNDS)]
        inputs: dict[str, dict[str, list[int]]] = {}
        for name in dict.fromkeys(n for shapes in parsed for n in shapes):
            if any(name not in shapes for shapes in parsed):
                raise BuildFlagError(f"{_where(index)} must give input '{name}' a min, an opt and a max shape")
            inputs[name] = {bound: shapes[name] for bound, shapes in zip(SHAPE_BOUNDS, parsed)}
        profiles.append({"inputs": inputs})
    return profiles or None


def _pairs(texts: list[str], flag: str) -> dict[str, str]:
    """NAME:VALUE pairs, comma-separated or repeated (the last ':' ends the name)."""
    pairs = {}
    for item in (item.strip() for text in texts for item in text.split(",") if item.strip()):
        key, separator, value = item.rpartition(":")
        if not separator or not key:
            raise BuildFlagError(f"{flag} {item}: write NAME:VALUE")
        pairs[key] = value
    return pairs


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """What the flags say, as the model's values; a flag left out is not there."""
    values: dict[str, Any] = {}
    for name, field, flag in _options():
        kind = _kind(field)
        given: Any = _profiles(args) if kind == "profiles" else getattr(args, name, None)
        if given is None:
            continue
        if kind == "pairs":
            given = _pairs(given, flag)
        elif kind == "repeated":
            given = [os.path.abspath(path) for path in given]  # the command line's paths are the working directory's
        values[name] = given
    return values


def _why(error: Any, field: FieldInfo | None = None) -> str:
    if field is not None and error["type"] in ("greater_than_equal", "less_than_equal"):
        low, high = _bounds(field)
        return f"use {low} to {high}"
    return str(error["msg"]).removeprefix("Value error, ")


def _refusal(error: Any, args: argparse.Namespace) -> str:
    """One validation error as the command line says it: the flag, what was given, why not."""
    location = list(error["loc"])
    options = {name: (field, flag) for name, field, flag in _options()}
    if not location or location[0] not in options:
        return _why(error)
    name = location[0]
    field, flag = options[name]
    kind = _kind(field)
    if kind == "profiles" and len(location) > 1:
        where = _where(int(location[1]))
        if len(location) > 3:
            return f"{where}: input '{location[3]}' {_why(error)}"
        return f"{where}: {_why(error)}"
    if kind == "pairs" and len(location) > 1:
        key = location[1]
        return f"{flag} {key}:{error['input']}: {_why(error)}"
    given = getattr(args, name, None)
    text = " ".join(map(str, given)) if isinstance(given, list) else str(given)
    return f"{flag} {text}: {_why(error, field if len(location) == 1 else None)}"


def from_flags(args: argparse.Namespace) -> EngineBuildOptions:
    """The build options the flags in `args` give, checked by the model; BuildFlagError says what is wrong."""
    try:
        return EngineBuildOptions.model_validate(_given(args))
    except ValidationError as error:
        raise BuildFlagError(_refusal(error.errors()[0], args)) from None
