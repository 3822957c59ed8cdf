"""The trainer config file (what DTRAIN_CONFIG holds), read by the trainer and by the engine builder.

A wrong file fails with one ConfigError line that names the field and the fix.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from dtrain_common.errors import ConfigError
from dtrain_operator.api import TrainerConfig
from dtrain_operator.api.validation import format_validation_error


def parse_config(text: str, source: str) -> TrainerConfig:
    """A TrainerConfig from YAML (wire format, camelCase), or a ConfigError naming each bad field."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: expected a mapping of trainer settings, got {type(document).__name__}")
    try:
        return TrainerConfig.model_validate(document)
    except ValidationError as exc:
        lines = format_validation_error(exc, TrainerConfig)
        raise ConfigError("; ".join(f"{source}: {line}" for line in lines)) from None


def load_config(path: Path) -> TrainerConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: the config is not a text (UTF-8) file") from None
    return parse_config(text, str(path))
