"""The summary's validation metrics come from the trainer's progress records, whichever logger runs."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from dtrain_operator.local.display import Display
from dtrain_operator.local.launch_plan import Workdir
from dtrain_operator.local.summary import collect_summary, steps_lost
from tests.builders import a_job


def summary_of(workdir: Workdir):
    return collect_summary(a_job("digits").as_model(), workdir, phase="Succeeded", reason="", message="", restarts=0,
                           wall_seconds=60, engine_asked=False)


def workdir_at(tmp_path: Path) -> Workdir:
    workdir = Workdir(tmp_path)
    for directory in (workdir.checkpoints, workdir.artifacts, workdir.logs):
        directory.mkdir()
    return workdir


def test_the_last_reported_validation_metrics_are_in_the_table(tmp_path: Path) -> None:
    workdir = workdir_at(tmp_path)
    records = [{"event": "progress", "step": 21, "metrics": {"val_acc": 0.81, "val_loss": 0.6}},
               {"event": "finished", "step": 43, "metrics": {"val_acc": 0.972, "val_loss": 0.09, "note": "x"}}]
    workdir.progress.write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = summary_of(workdir)
    assert summary.metrics == {"val_acc": 0.972, "val_loss": 0.09}
    out = io.StringIO()
    Display(Console(file=out, width=120)).summary(summary)
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in out.getvalue().splitlines() if line.count("│") == 3}
    assert (rows["val_acc"], rows["val_loss"]) == ("0.972", "0.09")


def test_no_records_no_metrics(tmp_path: Path) -> None:
    assert summary_of(workdir_at(tmp_path)).metrics == {}


def test_steps_lost_per_restart_are_the_steps_reached_less_the_step_resumed_from() -> None:
    records = [
        {"event": "start"}, {"event": "progress", "step": 4}, {"event": "checkpoint", "step": 4, "ok": True},
        {"event": "progress", "step": 6},
        # A survivor's checkpoint of step 7 (the last completed) and a resume from it: nothing lost.
        {"event": "checkpoint", "step": 7, "ok": True, "survivor": {"rank": 0, "step": 7}},
        {"event": "start"}, {"event": "resumed", "step": 7}, {"event": "progress", "step": 9},
        {"event": "checkpoint", "step": 10, "ok": False},  # not written: not reached as far as a resume goes
        # No checkpoint saved by anyone since step 7: the next gang trains steps 8 and 9 again.
        {"event": "start"}, {"event": "resumed", "step": 7}, {"event": "progress", "step": 12},
        # A gang that found no checkpoint starts over from step 0.
        {"event": "start"}, {"event": "progress", "step": 1}, {"event": "finished", "step": 20},
    ]
    assert steps_lost(records) == [0, 2, 12]
    assert steps_lost([{"event": "start"}, {"event": "progress", "step": 3}, {"event": "finished", "step": 5}]) == []
