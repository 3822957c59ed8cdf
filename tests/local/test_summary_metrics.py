"""The summary's validation metrics come from the trainer's progress records, whichever logger runs."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from dtrain_operator.local.display import Display
from dtrain_operator.local.launch_plan import Workdir
from dtrain_operator.local.summary import collect_summary
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
