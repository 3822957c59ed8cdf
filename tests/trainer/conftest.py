"""Helpers for the trainer tests: configs, real trainer processes, and a tiny Kubernetes API stand-in.

Every training run here is a real process (`python -m dtrain_trainer`, or torchrun
starting it), with OMP_NUM_THREADS=1 and tiny models so that the suite stays short on
two shared cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dtrain_operator.api import contract

USER_CODE = Path(__file__).parent / "user_code"
USER_MODEL = "dtrain_test_user.TinyClassifier"
USER_DATA = "dtrain_test_user.RandomImageData"
RUN_TIMEOUT_SECONDS = 240


def trainer_config(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    """A TrainerConfig (wire format) for a tiny CPU run in tmp_path; `sections` replace or extend its parts."""
    config: dict[str, Any] = {
        "jobName": "test-job",
        "accelerator": "cpu",
        "model": {"classPath": USER_MODEL, "initArgs": {}},
        "data": {"classPath": USER_DATA, "initArgs": {}},
        "trainer": {"maxSteps": 4, "batchSize": 8, "numWorkers": 0, "logEveryNSteps": 1, "precision": "32-true"},
        "checkpoint": {"dir": str(tmp_path / "checkpoints"), "everyNSteps": 2, "keepLast": 2},
        "artifacts": {"dir": str(tmp_path / "artifacts")},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def write_config(tmp_path: Path, config: dict[str, Any], name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a trainer process: this one, minus anything a launcher would set, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not contract.is_reserved_env_name(k) and k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(USER_CODE), *filter(None, [os.environ.get("PYTHONPATH")])])
    env[contract.ENV_PROGRESS_INTERVAL] = "0"
    env.update(extra)
    return env


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def run_trainer(config_path: Path, timeout: float = RUN_TIMEOUT_SECONDS, **env: str) -> Run:
    """`python -m dtrain_trainer --config FILE` as one process, without torchrun."""
    done = subprocess.run(
        [sys.executable, "-m", "dtrain_trainer", "--config", str(config_path)],
        env=process_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout, check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class ListSink:
    """A progress sink that keeps every record, to assert on what rank 0 reported."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def send(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))

    def close(self) -> None:
        pass
