"""`dtrain run` fails at once, without restarts, on what no restart can cure."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .dtrain_process import DtrainRun, tiny_job, write_job

pytestmark = pytest.mark.slow


def test_a_class_path_typo_fails_the_run_at_once_naming_the_class(tmp_path: Path) -> None:
    job = write_job(
        tmp_path,
        tiny_job(
            "tiny-typo",
            model={"classPath": "user_models.FailingClasifier"},
            runPolicy={"restartPolicy": "OnFailure", "backoffLimit": 3},
        ),
    )
    workdir = tmp_path / "work"
    started = time.monotonic()
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir))
    code = run.wait(120)
    assert code == 1, run.output
    assert run.leftovers() == []
    summary = json.loads((workdir / "summary.json").read_text())
    assert (summary["phase"], summary["reason"], summary["restarts"]) == ("Failed", "InvalidTrainerConfig", 0)
    assert "user_models.FailingClassifier" in summary["message"]  # the trainer's own hint
    assert "restarting the gang" not in run.output
    assert time.monotonic() - started < 60
