"""The summary's validation metrics: from the trainer's records where it reports them, else from the
CSV log Lightning writes under the artifacts directory."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from dtrain_operator import contract
from dtrain_operator.api import DistributedTraining
from dtrain_operator.local_display import Display
from dtrain_operator.local_plan import Workdir
from dtrain_operator.local_summary import collect_summary


def summary_of(workdir: Workdir):
    job = DistributedTraining.model_validate(
        {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "metadata": {"name": "digits"}, "spec": {}}
    )
    return collect_summary(job, workdir, phase="Succeeded", reason="", message="", restarts=0, wall_seconds=60,
                           engine_asked=False)


def workdir_at(tmp_path: Path) -> Workdir:
    workdir = Workdir(tmp_path)
    for directory in (workdir.checkpoints, workdir.artifacts, workdir.logs):
        directory.mkdir()
    return workdir


def test_the_last_logged_validation_metrics_are_in_the_table(tmp_path: Path) -> None:
    workdir = workdir_at(tmp_path)
    for version, rows in (("version_0", "0,21,,0.5,1.2\n"), ("version_1", "0,21,2.3,,\n0,21,,0.81,0.6\n1,43,0.2,,\n1,43,,0.972,0.09\n")):
        (workdir.artifacts / "logs" / version).mkdir(parents=True)
        (workdir.artifacts / "logs" / version / "metrics.csv").write_text("epoch,step,train_loss,val_acc,val_loss\n" + rows)
    summary = summary_of(workdir)
    assert summary.metrics == {"val_acc": 0.972, "val_loss": 0.09}
    out = io.StringIO()
    Display(Console(file=out, width=120)).summary(summary)
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in out.getvalue().splitlines() if line.count("│") == 3}
    assert (rows["val_acc"], rows["val_loss"]) == ("0.972", "0.09")


def test_metrics_in_the_trainers_records_come_first(tmp_path: Path) -> None:
    workdir = workdir_at(tmp_path)
    workdir.progress.write_text(json.dumps({"event": "progress", "step": 5, "metrics": {"val_acc": 0.99, "note": "x"}}) + "\n")
    (workdir.artifacts / "logs" / "version_0").mkdir(parents=True)
    (workdir.artifacts / "logs" / "version_0" / "metrics.csv").write_text("epoch,step,val_acc\n0,5,0.5\n")
    assert summary_of(workdir).metrics == {"val_acc": 0.99}
    (tmp_path / "empty").mkdir()
    assert summary_of(workdir_at(tmp_path / "empty")).metrics == {}
