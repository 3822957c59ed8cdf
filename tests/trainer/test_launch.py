"""The worker launcher passes on the failing worker's own exit code, which torchrun hides behind 1.

restartPolicy ExitCode depends on it: a killed worker (128+n) is retried, a worker's own
error (1-127) is not.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dtrain_operator.core.render import TRAINER_COMMAND

from .conftest import process_env


@pytest.mark.parametrize(
    "body, expected",
    [
        ("import sys; sys.exit(3)", 3),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137),
        ("pass", 0),
    ],
    ids=["own-error", "killed", "success"],
)
def test_launcher_exits_with_the_workers_code(tmp_path: Path, body: str, expected: int) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(body + "\n")
    launcher = [sys.executable, *TRAINER_COMMAND[1:3]]  # `python -m dtrain_trainer.launch`, as in the pod
    proc = subprocess.run(
        [*launcher, "--nnodes=1", "--nproc-per-node=1", "--master-port=0", str(worker)],
        env=process_env(),
        capture_output=True,
        text=True,
        timeout=120, check=False,
    )
    assert proc.returncode == expected, proc.stderr[-2000:]
    if expected:
        assert "exitcode" in proc.stderr  # torchrun's failure report is kept for the person reading the log


def test_a_home_the_user_cannot_write_fails_at_once_with_the_reason(tmp_path: Path) -> None:
    """An image built FROM a root base runs as uid 10001 (the pod's runAsUser): it says so at once."""
    env = {**process_env(), "HOME": str(tmp_path / "missing-home")}
    run = subprocess.run([sys.executable, "-m", "dtrain_trainer.launch", "-m", "dtrain_trainer"], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 1
    assert "is not a writable directory: build your image FROM the dtrain trainer image" in run.stderr
