"""The epoch in the last records is the last epoch trained, not Lightning's counter one past it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtrain_operator.local.display import ProgressView

from .conftest import read_jsonl, run_trainer, trainer_config, write_config

pytestmark = pytest.mark.slow


# Every 2 steps, the last step (4) is saved in the loop; every 3, once more after it (on_train_end).
@pytest.mark.parametrize("every_n_steps", [2, 3])
def test_the_last_records_say_the_last_epoch(tmp_path: Path, every_n_steps: int) -> None:
    config = trainer_config(
        tmp_path, data={"initArgs": {"num_samples": 16}}, trainer={"maxSteps": -1, "maxEpochs": 2}
    )
    config["checkpoint"]["everyNSteps"] = every_n_steps
    progress = tmp_path / "progress.jsonl"
    run = run_trainer(write_config(tmp_path, config), DTRAIN_PROGRESS_SINK=f"jsonl:{progress}")
    assert run.returncode == 0, run.stderr
    records = read_jsonl(progress)
    progress_records = [r for r in records if r["event"] == "progress"]
    assert max(r["epoch"] for r in progress_records) == 1
    last_progress = progress_records[-1]
    assert last_progress["stage"] == "exporting" and last_progress["epoch"] == 1
    # Once fit returns, before the export, rank 0 says training is over: the progress deadline holds from there.
    assert progress_records[-2]["stage"] == "finishing" and progress_records[-2]["step"] == 4
    assert records[-1]["event"] == "finished" and (records[-1]["epoch"], records[-1]["step"]) == (1, 4)
    view = ProgressView(started=0.0)
    for record in records:
        view.apply(record, now=1.0, restarts=0)
    assert view.fields(1.0)["epoch"] == "2/2"
