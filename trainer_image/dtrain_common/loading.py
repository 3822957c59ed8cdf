"""The model and the data module from `classPath` + `initArgs`, LightningCLI's shape.

A user's own LightningModule or LightningDataModule is anything importable in the image
(or on PYTHONPATH locally). Every way of getting it wrong - a module that does not
import, a name that is not there, a class of the wrong kind, arguments the class does
not take - ends in one ConfigError line that names the field.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from dtrain_common.errors import ConfigError
from dtrain_operator import api
from dtrain_operator.api.builtin_classes import BUILTIN_ALIASES


def import_class(class_path: str, field: str) -> type:
    """The class named by `class_path` (a bare built-in name or `package.module.Class`)."""
    class_path = BUILTIN_ALIASES.get(class_path, class_path)
    if "." not in class_path:
        hint = difflib.get_close_matches(class_path, list(BUILTIN_ALIASES), n=1)
        suggestion = f"; did you mean {hint[0]}?" if hint else ""
        raise ConfigError(
            f"{field}.classPath: {class_path!r} is neither a built-in ({', '.join(BUILTIN_ALIASES)}) "
            f"nor a dotted path like mypackage.MyModule{suggestion}"
        )
    module_name, class_name = class_path.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{field}.classPath: cannot import {module_name!r} ({exc}); install it in the image "
            "(or put it on PYTHONPATH when running locally)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a user's module failing on import is their bug; show it in one line
        raise ConfigError(f"{field}.classPath: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    found = getattr(module, class_name, None)
    if found is None:
        names = [n for n, v in vars(module).items() if inspect.isclass(v) and not n.startswith("_")]
        hint = difflib.get_close_matches(class_name, names, n=1)
        suggestion = f"; did you mean {module_name}.{hint[0]}?" if hint else ""
        raise ConfigError(f"{field}.classPath: module {module_name!r} has no {class_name!r}{suggestion}")
    if not inspect.isclass(found):
        found_text = f"{type(found).__name__} {found!r:.60}"
        raise ConfigError(f"{field}.classPath: {class_path} is not a class (found {found_text})")
    return found


def _check_arguments(cls: type, signature: inspect.Signature, given: set[str], field: str) -> None:
    params = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not takes_any:
        for key in sorted(given - set(named)):
            hint = difflib.get_close_matches(key, named, n=1)
            suggestion = f"did you mean {hint[0]!r}? " if hint else ""
            raise ConfigError(
                f"{field}.initArgs.{key}: {cls.__name__} takes no argument {key!r}; {suggestion}"
                f"it takes: {', '.join(named) or 'no arguments'}"
            )
    missing = [n for n in named if params[n].default is inspect.Parameter.empty and n not in given]
    if missing:
        raise ConfigError(f"{field}.initArgs: {cls.__name__} needs {', '.join(repr(m) for m in missing)}")


def instantiate(
    spec: api.ClassSpec,
    field: str,
    base: type,
    supplied: Mapping[str, tuple[Any, str]] | None = None,
    cls: type | None = None,
) -> Any:
    """An instance of `spec.class_path` built with `spec.init_args`.

    `supplied` maps argument names the trainer passes itself (e.g. batch_size) to their
    value and the config field they come from; a class receives them when its
    constructor names them, and initArgs may not set them as well. `cls`, when given, is the
    class already imported from spec.class_path (e.g. a built-in put on another Lightning package).
    """
    cls = cls or import_class(spec.class_path, field)
    if not issubclass(cls, base):
        raise ConfigError(f"{field}.classPath: {spec.class_path} is not a {base.__name__} subclass")
    args = dict(spec.init_args)
    supplied = supplied or {}
    for name, (_, source) in supplied.items():
        if name in args:
            raise ConfigError(f"{field}.initArgs.{name}: set {source} instead; the trainer passes it to the class")
    signature = inspect.signature(cls)
    accepted = {name: value for name, (value, _) in supplied.items() if name in signature.parameters}
    _check_arguments(cls, signature, set(args) | set(accepted), field)
    try:
        return cls(**args, **accepted)
    except (TypeError, ValueError, OSError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise ConfigError(f"{field}.initArgs: {cls.__name__}: {message}") from None
