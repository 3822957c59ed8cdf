"""Where a hang sits, through `dtrain run`: real ranks hang, rank 0 collects every rank's stacks through
torchrun's store, and the progress deadline's restart names the rank(s) apart, their pod and the frame.
(A rank stuck in its own training_step: tests/local/test_run.py's hang test.)"""

from __future__ import annotations

import json
import pickle
import signal
from pathlib import Path
from typing import Any

import pytest

from .dtrain_process import DtrainRun, hang_job, torchrun_of_node, wait_for_record, write_job

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 240


def hang_of(workdir: Path) -> tuple[dict[str, Any], Path]:
    """The run's summary (with where its hang sat) and the directory of the hang's full stacks."""
    summary = json.loads((workdir / "summary.json").read_text())
    dumps = sorted((workdir / "artifacts" / "hangs").iterdir())
    assert len(dumps) == 1, dumps
    return summary, dumps[0]


def hung_once(tmp_path: Path, job: dict[str, Any], marker: Path) -> tuple[DtrainRun, dict[str, Any], Path]:
    """`dtrain run` of a job that hangs once (its `marker` says so): restarted once by the deadline, then done."""
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(write_job(tmp_path, job)), "--workdir", str(workdir), "--no-engine")
    assert run.wait(RUN_TIMEOUT) == 0, run.output
    assert marker.exists()
    summary, dumps = hang_of(workdir)
    assert summary["restarts"] == 1
    return run, summary, dumps


def test_a_rank_stuck_in_its_data_loader_is_named_at_its_dataset_code(tmp_path: Path) -> None:
    marker = tmp_path / "hung"
    run, summary, dumps = hung_once(tmp_path, hang_job(
        "tiny-loader",
        data={"classPath": "user_models.HangingDataModule", "initArgs": {"marker": str(marker), "hang_after_samples": 40}},
    ), marker)
    named = "rank 1 (pod tiny-loader-1, local node 1) is in the data loader at user_models.py:"
    assert named in run.output and "_HangingSamples.__getitem__" in run.output
    # Rank 0 went on to the next step: DDP's forward broadcasts the model's buffers (BatchNorm's) to every rank.
    assert "not where the others are: rank 0 is in a collective (DistributedDataParallel." in run.output
    assert summary["last_hang"].startswith(f"Where it hangs: {named}")
    assert f"Every rank's stacks: {dumps}/stacks.txt" in run.output
    stacks = (dumps / "stacks.txt").read_text()
    assert "rank 0 (pod tiny-loader-0" in stacks and "rank 1 (pod tiny-loader-1" in stacks
    assert "in _HangingSamples.__getitem__" in stacks


def test_a_stopped_rank_gives_no_stack_and_is_named_by_its_silence(tmp_path: Path) -> None:
    job = write_job(tmp_path, hang_job("tiny-stopped", data={"initArgs": {"num_samples": 512}}))
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir), "--no-engine")
    wait_for_record(run, workdir, lambda r: r.get("event") == "checkpoint" and r.get("step") == 2, timeout=RUN_TIMEOUT)
    node = torchrun_of_node(run, 1)
    assert node is not None, run.output
    [worker] = node.children()
    worker.send_signal(signal.SIGSTOP)  # the gang's stop kills it as it is
    assert run.wait(RUN_TIMEOUT) == 0, run.output
    assert run.leftovers() == []
    summary, dumps = hang_of(workdir)
    assert summary["restarts"] == 1 and summary["steps"] == 16
    assert "rank 1 (pod tiny-stopped-1, local node 1) gave no stack: stopped (SIGSTOP)" in run.output
    assert "not where the others are: rank 0 is in" in run.output
    stacks = (dumps / "stacks.txt").read_text()
    assert "rank 0 (pod tiny-stopped-0" in stacks and "rank 1: no answer within 3 s" in stacks


def test_every_rank_waiting_in_one_collective_names_none_and_keeps_the_flight_recorders_dumps(tmp_path: Path) -> None:
    marker = tmp_path / "crossed"
    run, _, dumps = hung_once(tmp_path, hang_job(
        "tiny-crossed",
        model={"classPath": "user_models.CrossedCollectivesClassifier", "initArgs": {"marker": str(marker), "hang_at_step": 3}},
        # The flight recorder is on for GPU jobs; here gloo's records the CPU run's collectives.
        env=[{"name": "TORCH_FR_BUFFER_SIZE", "value": "64"}],
    ), marker)
    assert (
        "Where it hangs: every rank (0-1) stands at the same place, in a collective (torch.distributed.all_reduce) "
        "called from user_models.py:"
    ) in run.output
    assert "CrossedCollectivesClassifier.training_step: no rank differs" in run.output
    for rank in (0, 1):
        recorded = pickle.loads((dumps / f"flight-recorder-rank-{rank}").read_bytes())
        assert any("all_reduce" in str(entry.get("profiling_name")) for entry in recorded["entries"]), recorded
        # Which collective each process group last issued and last completed: one never completed.
        groups = recorded["pg_status"].values()
        assert any(g["last_enqueued_collective"] > g["last_completed_collective"] for g in groups), recorded["pg_status"]
