"""`dtrain run` end to end: real torchrun nodes training with gloo, gang restarts, failures, Ctrl-C."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from dtrain_operator.cli import main as cli

from .dtrain_process import (
    HANG_DEADLINE,
    DtrainRun,
    hang_job,
    records,
    tiny_job,
    torchrun_of_node,
    wait_for_record,
    write_job,
)

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 240


def summary_of(workdir: Path) -> dict[str, Any]:
    return json.loads((workdir / "summary.json").read_text())


def test_a_job_runs_end_to_end_with_the_engine_step(tmp_path: Path) -> None:
    job = write_job(tmp_path, tiny_job("tiny-e2e"))
    workdir = tmp_path / "dtrain-runs" / "tiny-e2e"
    run = DtrainRun(tmp_path, str(job))
    code = run.wait(RUN_TIMEOUT)
    assert code == 0, run.output
    assert run.leftovers() == []
    for name in ("model.onnx", "artifacts.json", "engine-report.json"):
        assert (workdir / "artifacts" / name).is_file(), name
    summary = summary_of(workdir)
    assert summary["phase"] == "Succeeded"
    assert (summary["nodes"], summary["devices_per_node"], summary["restarts"]) == (2, 1, 0)
    assert summary["steps"] == 4  # 128 samples / (16 per rank x 2 ranks)
    assert summary["onnx_parity_error"] is not None and summary["onnx_parity_error"] < 1e-3
    assert summary["engine_backend"] in ("tensorrt", "onnxruntime-cpu")
    assert [row["batch"] for row in summary["latency"]] == [1, 2, 4]
    assert all(row["eager_ms"] and row["speedup"] for row in summary["latency"])
    # Each node kept its log; the summary table names both nodes.
    assert (workdir / "logs" / "node-0.log").is_file() and (workdir / "logs" / "node-1.log").is_file()
    assert "gang started: node 0" in run.output and "node 1" in run.output
    assert "2 x 1 cpu (nodes 0, 1)" in run.output
    assert "speed-up" in run.output


def test_a_killed_node_restarts_the_gang_from_its_checkpoint(tmp_path: Path) -> None:
    job = write_job(
        tmp_path,
        tiny_job(
            "tiny-restart",
            data={"initArgs": {"num_samples": 1024}},
            runPolicy={"backoffLimit": 2},
        ),
    )
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir), "--no-engine")
    checkpoint = wait_for_record(run, workdir, lambda r: r.get("event") == "checkpoint", timeout=RUN_TIMEOUT)
    # Node 1 dies as a machine would: its torchrun is killed outright, leaving its worker orphaned.
    node = torchrun_of_node(run, 1)
    assert node is not None, run.output
    node.kill()
    code = run.wait(RUN_TIMEOUT)
    assert code == 0, run.output
    assert run.leftovers() == []
    summary = summary_of(workdir)
    assert (summary["phase"], summary["restarts"], summary["steps"]) == ("Succeeded", 1, 32), run.output
    resumed = [r for r in records(workdir) if r.get("event") == "resumed"]
    assert resumed and resumed[0]["step"] >= checkpoint["step"]
    assert "worker 1 exited with code 137 (SIGKILL)" in run.output
    assert "restarted from the last checkpoint (restart 1)" in run.output
    assert "│ restarts          │ 1" in run.output
    # Where the wall time went: every second in one category, the restart's among them.
    goodput = summary["goodput"]
    assert sum(goodput["seconds"].values()) == pytest.approx(summary["wall_seconds"], rel=0.05)
    assert {"starting", "productive", "restarting"} <= set(goodput["seconds"]) and 0 < goodput["ratio"] < 1
    assert f"│ goodput           │ {goodput['ratio']:.0%} productive (" in run.output


def test_a_rank_sigkilled_mid_epoch_loses_no_step_and_ends_with_the_uninterrupted_weights(tmp_path: Path) -> None:
    """Rank 1 is SIGKILLed once 3 steps are done, mid-epoch, far from the checkpoint grid (every 100 steps):
    rank 0, the survivor, saves step 3 before it exits, the restarted gang resumes from it (steps lost 0),
    and the run ends with the weights (and BatchNorm statistics) of the same run never interrupted."""
    kill_at = 3
    marker = tmp_path / "killed"

    def job(name: str) -> Path:
        return write_job(tmp_path, tiny_job(
            name,
            # resnet18: BatchNorm (buffers a forward changes) and no dropout (the random state is not checkpointed).
            model={"classPath": "user_models.KilledClassifier", "initArgs": {
                "marker": str(marker), "kill_at_step": kill_at, "arch": "resnet18"}},
            data={"initArgs": {"num_samples": 256}},  # 8 steps
            checkpoint={"everyNSteps": 100, "keepLast": 1},
            export={"onnx": {"enabled": False}},
            engine={"enabled": False},
        ))

    def final_weights(workdir: Path) -> dict[str, Any]:
        saved = torch.load(workdir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        assert saved["global_step"] == 8
        return saved["state_dict"]  # type: ignore[no-any-return]

    killed_run = tmp_path / "killed-run"
    run = DtrainRun(tmp_path, str(job("tiny-killed")), "--workdir", str(killed_run), "--no-engine")
    assert run.wait(RUN_TIMEOUT) == 0, run.output
    assert marker.read_text() == f"killed after step {kill_at}\n"
    assert run.leftovers() == []
    assert "worker 1 exited with code 137 (SIGKILL)" in run.output
    assert f"checkpoint of step {kill_at} saved by surviving rank 0 after a peer was lost" in (
        killed_run / "logs" / "node-0.log").read_text()
    saved = [r for r in records(killed_run) if r.get("event") == "checkpoint" and r.get("survivor")]
    assert [(r["step"], r["survivor"]["rank"]) for r in saved] == [(kill_at, 0)], run.output
    resumed = [r for r in records(killed_run) if r.get("event") == "resumed"]
    assert [(r["step"], r["survivor"]["step"]) for r in resumed] == [(kill_at, kill_at)], run.output
    assert f"resumed from {killed_run / 'checkpoints'}" in run.output
    summary = summary_of(killed_run)
    assert (summary["phase"], summary["restarts"], summary["steps"], summary["steps_lost"]) == ("Succeeded", 1, 8, [0])
    assert "│ restarts          │ 1; steps lost 0" in run.output

    whole_run = tmp_path / "whole-run"  # the marker exists now: nobody is killed
    whole = DtrainRun(tmp_path, str(job("tiny-whole")), "--workdir", str(whole_run), "--no-engine")
    assert whole.wait(RUN_TIMEOUT) == 0, whole.output
    expected, actual = final_weights(whole_run), final_weights(killed_run)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_failing_model_with_no_restarts_left_fails_and_shows_the_log(tmp_path: Path) -> None:
    job = write_job(
        tmp_path,
        tiny_job(
            "tiny-fail",
            model={"classPath": "user_models.FailingClassifier", "initArgs": {"fail_at_step": 1, "fail_on_rank": 1}},
            runPolicy={"backoffLimit": 0},
        ),
    )
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir))
    code = run.wait(RUN_TIMEOUT)
    assert code == 1, run.output
    assert run.leftovers() == []
    assert "last lines of node 1's log" in run.output
    assert "FailingClassifier fails on purpose at step 1" in run.output
    summary = summary_of(workdir)
    assert (summary["phase"], summary["reason"], summary["restarts"]) == ("Failed", "BackoffLimitExceeded", 0)
    assert "backoffLimit is 0" in summary["message"]
    assert not (workdir / "artifacts" / "engine-report.json").exists()


def test_ctrl_c_stops_every_process_and_resume_continues(tmp_path: Path) -> None:
    job = write_job(tmp_path, tiny_job("tiny-stop", data={"initArgs": {"num_samples": 1024}}))
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir), "--no-engine")
    wait_for_record(run, workdir, lambda r: r.get("event") == "checkpoint", timeout=RUN_TIMEOUT)
    run.popen.send_signal(signal.SIGINT)
    assert run.wait(60) == 128 + signal.SIGINT, run.output
    assert run.leftovers() == []
    assert "stopped by SIGINT" in run.output
    assert f"the last checkpoint is {workdir / 'checkpoints'}" in run.output
    assert "--resume" in run.output
    assert summary_of(workdir)["phase"] == "Stopped"

    again = DtrainRun(tmp_path, str(job), "--workdir", str(workdir), "--no-engine", "--resume")
    assert again.wait(RUN_TIMEOUT) == 0, again.output
    resumed = [r for r in records(workdir) if r.get("event") == "resumed"]
    assert resumed and resumed[0]["step"] >= 2
    assert summary_of(workdir)["steps"] == 32


def test_active_deadline_seconds_stops_the_run(tmp_path: Path) -> None:
    job = write_job(tmp_path, tiny_job("tiny-deadline", runPolicy={"activeDeadlineSeconds": 3}))
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir))
    assert run.wait(60) == 1, run.output
    assert run.leftovers() == []
    summary = summary_of(workdir)
    assert (summary["phase"], summary["reason"]) == ("Failed", "DeadlineExceeded")
    assert "activeDeadlineSeconds (3 s)" in run.output


def test_a_bad_file_prints_the_validation_errors_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tiny_job("Bad_Name", trainer={"maxEpochs": 0}, nodez=2)
    path = write_job(tmp_path, job)
    workdir = tmp_path / "work"
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert cli.main(["run", str(path), "--workdir", str(workdir)]) == 2
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children_before
    err = capsys.readouterr().err
    assert "metadata.name: String should match pattern" in err
    assert "spec.trainer.maxEpochs: Input should be greater than or equal to 1" in err
    assert "spec.nodez: unknown field; did you mean 'nodes'?" in err
    assert not workdir.exists()


def test_a_rank_that_hangs_is_restarted_by_the_progress_deadline_and_the_run_succeeds(tmp_path: Path) -> None:
    # The clock starts at the first batch of each gang; rank 0 collects every rank's stacks 23 s into the stall.
    marker = tmp_path / "hung"
    job = write_job(
        tmp_path,
        hang_job(
            "tiny-hang",
            model={"classPath": "user_models.HangingClassifier", "initArgs": {"marker": str(marker), "hang_at_step": 3}},
        ),
    )
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir), "--no-engine")
    wait_for_record(run, workdir, lambda r: r.get("event") == "checkpoint" and r.get("step") == 2, timeout=RUN_TIMEOUT)
    hung_at = time.monotonic()
    assert run.wait(RUN_TIMEOUT) == 0, run.output
    assert marker.exists()
    assert "ProgressDeadlineExceeded" in run.output
    assert f"progressDeadlineSeconds is {HANG_DEADLINE}" in run.output
    summary = summary_of(workdir)
    assert (summary["phase"], summary["restarts"]) == ("Succeeded", 1)
    # Each start ran the pre-flight check: the summary has the latest one's figures.
    assert summary["preflight"]["worldSize"] == 2 and summary["preflight"]["busBandwidthGBps"] > 0
    assert run.output.count("pre-flight: 2 ranks joined") == 2
    resumed = [r for r in records(workdir) if r.get("event") == "resumed"]
    assert resumed and resumed[0]["step"] == 2
    # Well before the collective timeout (nccl.timeoutSeconds, 1800 s) would have ended the wait.
    assert time.monotonic() - hung_at < 1800 / 10
    # Where it hung: rank 0 collected every rank's stacks before the deadline, and the restart names rank 1.
    named = "rank 1 (pod tiny-hang-1, local node 1) is in its own code at user_models.py:"
    assert named in run.output and "in HangingClassifier._maybe_hang" in run.output
    assert "not where the others are: rank 0 is in the backward pass (DDP's gradient all-reduce)" in run.output
    assert summary["last_hang"].startswith(f"Where it hangs: {named}")
    [dumps] = (workdir / "artifacts" / "hangs").iterdir()
    assert "Thread MainThread (the training thread)" in (dumps / "stacks.txt").read_text()


def test_ranks_slow_to_exit_after_training_are_not_taken_for_a_hang(tmp_path: Path) -> None:
    # Once training is over rank 0 says so (stage finishing), and the deadline's clock holds: ranks that take
    # twice the deadline to exit were restarted as a hung gang before.
    job = write_job(
        tmp_path,
        hang_job(
            "tiny-slow-exit",
            model={"classPath": "user_models.SlowToExitClassifier", "initArgs": {"exit_seconds": 2 * HANG_DEADLINE}},
        ),
    )
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir), "--no-engine")
    assert run.wait(RUN_TIMEOUT) == 0, run.output
    assert "ProgressDeadlineExceeded" not in run.output
    summary = summary_of(workdir)
    assert (summary["phase"], summary["restarts"]) == ("Succeeded", 0)


def test_a_gang_stuck_in_the_barrier_after_a_checkpoint_is_restarted_too(tmp_path: Path) -> None:
    """Rank 0 writes the step-4 checkpoint, then waits in Lightning's barrier for rank 1, which hangs."""
    marker = tmp_path / "hung"
    job = write_job(
        tmp_path,
        hang_job(
            "tiny-hang-save",
            model={
                "classPath": "user_models.HangingClassifier",
                "initArgs": {"marker": str(marker), "hang_at_step": 4, "hang_in": "save"},
            },
        ),
    )
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir), "--no-engine")
    assert run.wait(RUN_TIMEOUT) == 0, run.output
    assert "in save" in marker.read_text()
    assert "ProgressDeadlineExceeded" in run.output
    assert "in HangingClassifier._maybe_hang - not where the others are: rank 0 is in a collective (torch.distributed.barrier)" in run.output
    assert summary_of(workdir)["restarts"] == 1


def test_a_slow_rank_is_named_a_straggler_and_nothing_restarts(tmp_path: Path) -> None:
    job = write_job(
        tmp_path,
        tiny_job(
            "tiny-slow",
            model={"classPath": "user_models.SlowClassifier", "initArgs": {"delay": 0.3, "slow_rank": 1}},
            data={"initArgs": {"num_samples": 384}},
            stragglers={"everyNSteps": 2, "factor": 1.5, "window": 2},
            export={"onnx": {"enabled": False}},
            engine={"enabled": False},
        ),
    )
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir), "--no-engine")
    assert run.wait(RUN_TIMEOUT) == 0, run.output
    assert "rank 1 (pod tiny-slow-1, local node 1) is a straggler" in run.output
    summary = summary_of(workdir)
    assert (summary["phase"], summary["restarts"]) == ("Succeeded", 0)
    times = summary["stragglers"]
    assert (times["slowestRank"], times["slowestPod"], times["straggler"]) == (1, "tiny-slow-1", True)
    assert times["ratio"] > 1.5 and times["slowestSeconds"] >= 0.3
    assert summary["step_breakdown"]["bottleneck"].startswith("rank 1: ")
    assert "% of its step is the forward pass and loss" in summary["step_breakdown"]["bottleneck"]
    # The first comparison that can report it is at step everyNSteps x window (4); the first steps of a
    # process (warm-up, on every rank) may hide it for one comparison more.
    detected = next(r for r in records(workdir) if (r.get("stepTimes") or {}).get("straggler"))
    assert 4 <= detected["stepTimes"]["step"] <= 8


def test_the_step_breakdown_names_the_rank_whose_data_loader_is_slow(tmp_path: Path) -> None:
    job = write_job(
        tmp_path,
        tiny_job(
            "tiny-slow-data",
            data={"classPath": "user_models.SlowLoaderDataModule", "initArgs": {"delay_per_sample": 0.05, "slow_rank": 1,
                                                                               "num_samples": 256}},
            stragglers={"everyNSteps": 4},
            export={"onnx": {"enabled": False}},
            engine={"enabled": False},
        ),
    )
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir), "--no-engine")
    assert run.wait(RUN_TIMEOUT) == 0, run.output
    breakdown = summary_of(workdir)["step_breakdown"]
    line = breakdown["bottleneck"]
    assert line.startswith("rank 1: ") and line.endswith("% of its step waits on the data loader; trainer.numWorkers 0"), line
    printed = " ".join(run.output.replace("\u2502", " ").split())  # the summary table's cells, unwrapped
    assert f"bottleneck {line}" in printed
    slow, other = (next(r for r in breakdown["ranks"] if r["rank"] == rank) for rank in (1, 0))
    # The slow rank waits on its loader; the other waits for it in the gradient all-reduce.
    assert slow["dataWait"] > other["dataWait"] and other["allReduce"] > slow["allReduce"]
    assert all(slow[part] > 0 for part in ("forward", "backward", "optimizer"))
