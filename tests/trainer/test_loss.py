"""The loss in progress records is the model's own, averaged over the accumulation window."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import USER_MODEL, read_jsonl, run_trainer, trainer_config, write_config

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("accumulate", [1, 4])
def test_reported_loss_is_the_models_loss_averaged_over_each_optimizer_step(tmp_path: Path, accumulate: int) -> None:
    batch_log = tmp_path / "batches"
    config = trainer_config(
        tmp_path,
        model={"classPath": USER_MODEL, "initArgs": {"batch_log": str(batch_log)}},
        trainer={"maxSteps": 3, "accumulateGradBatches": accumulate},
        export={"onnx": {"enabled": False}},
    )
    progress = tmp_path / "progress.jsonl"
    run = run_trainer(write_config(tmp_path, config), DTRAIN_PROGRESS_SINK=f"jsonl:{progress}")
    assert run.returncode == 0, run.stderr
    losses = [float(line.split()[3]) for line in (tmp_path / "batches.rank0").read_text().splitlines()]
    assert len(losses) == 3 * accumulate
    windows = [sum(losses[i : i + accumulate]) / accumulate for i in range(0, len(losses), accumulate)]
    by_step = {r["step"]: r["loss"] for r in read_jsonl(progress) if r["event"] == "progress"}
    for step in (1, 2, 3):
        assert by_step[step] == pytest.approx(windows[step - 1], rel=1e-5), (by_step, windows)
    finished = read_jsonl(progress)[-1]
    assert finished["event"] == "finished" and finished["loss"] == pytest.approx(windows[-1], rel=1e-5)
