"""The trainer image agrees with what the operator renders (.ci/images builds and runs it: tests/images)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dtrain_operator.core.render import TRAINER_COMMAND

DOCKERFILE = (Path(__file__).parents[2] / "trainer_image" / "Dockerfile").read_text()


def test_entrypoint_is_the_rendered_worker_command() -> None:
    (entrypoint,) = re.findall(r"^ENTRYPOINT (.+)$", DOCKERFILE, re.MULTILINE)
    assert json.loads(entrypoint) == TRAINER_COMMAND


def test_runs_as_a_numeric_non_root_user() -> None:
    (user,) = re.findall(r"^USER (\d+)(?::\d+)?$", DOCKERFILE, re.MULTILINE)
    assert int(user) != 0


def test_installs_the_trainer_extra_on_a_cuda_pytorch_base() -> None:
    (base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert re.fullmatch(r"pytorch/pytorch:[\d.]+-cuda[\d.]+-cudnn\d+-runtime", base)
    assert '[trainer]"' in DOCKERFILE
    assert "--constraint /tmp/base-torch.txt" in DOCKERFILE  # the base's CUDA torch is kept


def test_the_image_holds_the_quick_starts_data() -> None:
    """The digits data set ships in the trainer package (not scikit-learn, whose SciPy torchmetrics would import at
    every trainer start), and the build loads it."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    trainer = pyproject["project"]["optional-dependencies"]["trainer"]
    assert not any(re.match(r"(scikit-learn|scipy)\b", requirement) for requirement in trainer)
    assert "digits.csv.gz" in pyproject["tool"]["setuptools"]["package-data"]["dtrain_trainer"]
    assert "from dtrain_trainer.digits import load_digits_tensors" in DOCKERFILE
