"""`dtrain run` applies runPolicy.failureRules as the operator does: real torchrun nodes, a worker that dies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .dtrain_process import DtrainRun, tiny_job, write_job

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 240


def test_a_rule_restarts_what_restart_policy_alone_would_fail(tmp_path: Path) -> None:
    """Rank 1 exits 3 after printing a CUDA error. restartPolicy ExitCode alone fails the job on exit code 3,
    and a backoffLimit of 0 allows no counted restart; the second rule matches the code and the termination
    message (the end of the node's log, as FallbackToLogsOnError makes it in a pod) and restarts the gang
    without counting it. The first rule (exit code 4) does not match."""
    marker = tmp_path / "crashed"
    job = write_job(
        tmp_path,
        tiny_job(
            "tiny-rules",
            model={"classPath": "user_models.CrashingClassifier",
                   "initArgs": {"marker": str(marker), "crash_at_step": 2, "crash_on_rank": 1, "exit_code": 3}},
            runPolicy={
                "restartPolicy": "ExitCode",
                "backoffLimit": 0,
                "failureRules": [
                    {"action": "FailJob", "onExitCodes": [4]},
                    {"action": "RestartGangIgnoringBackoff", "onExitCodes": [3, "64-70"],
                     "onTerminationMessage": "CUDA error: an illegal memory access"},
                ],
            },
        ),
    )
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir), "--no-engine")
    code = run.wait(RUN_TIMEOUT)
    assert code == 0, run.output
    assert marker.is_file()
    assert run.leftovers() == []
    summary = json.loads((workdir / "summary.json").read_text())
    assert (summary["phase"], summary["restarts"], summary["restarts_ignoring_backoff"]) == ("Succeeded", 0, 1), run.output
    assert summary["steps"] == 4
    decided = ("failureRules[1] (RestartGangIgnoringBackoff on exit code 3 and termination message "
               "/CUDA error: an illegal memory access/) decided: worker 1 exited with code 3")
    assert decided in " ".join(run.output.split())  # the console wraps long lines
    assert "not counted against backoffLimit" in run.output
    assert "restarted from the last checkpoint (restart 1)" in run.output
