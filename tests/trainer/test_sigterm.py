"""SIGTERM, as the kubelet sends it to a pod's launcher: every rank stops at one step, rank 0 checkpoints it, exit 143."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dtrain_operator.api import contract
from dtrain_operator.core.render import TRAINER_COMMAND

from ..ports import free_port
from .conftest import USER_MODEL, process_env, read_jsonl, trainer_config, write_config

pytestmark = pytest.mark.slow


def wait_for_step(progress: Path, step: int, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if progress.exists() and any(
            r.get("event") == "progress" and (r.get("step") or 0) >= step for r in read_jsonl_safe(progress)
        ):
            return
        assert proc.poll() is None, "the trainer ended before it was signalled"
        time.sleep(0.1)
    raise AssertionError(f"no progress record for step {step} within {timeout} s")


def read_jsonl_safe(path: Path) -> list[dict[str, object]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def test_sigterm_stops_every_rank_at_one_step_with_a_checkpoint_and_exits_143(tmp_path: Path) -> None:
    records = tmp_path / "records"
    config = trainer_config(
        tmp_path,
        model={"classPath": USER_MODEL, "initArgs": {"record_dir": str(records)}},
        data={"initArgs": {"num_samples": 4096}},
        trainer={"maxSteps": 100000, "maxEpochs": 1},
        # No step checkpoint would come for a long time: the one found is SIGTERM's.
        checkpoint={"everyNSteps": 10000, "keepLast": 1},
    )
    progress = tmp_path / "progress.jsonl"
    env = process_env(
        **{
            contract.ENV_CONFIG: str(write_config(tmp_path, config)),
            contract.ENV_NNODES: "1",
            contract.ENV_NPROC_PER_NODE: "2",
            contract.ENV_NODE_RANK: "0",
            contract.ENV_MASTER_ADDR: "127.0.0.1",
            contract.ENV_MASTER_PORT: str(free_port()),
            contract.ENV_SHUTDOWN_TIMEOUT: "60",
            contract.ENV_PROGRESS_SINK: f"jsonl:{progress}",
            contract.ENV_TERMINATION_LOG: str(tmp_path / "termination-log"),
        }
    )
    log = (tmp_path / "launcher.log").open("w")
    # The pod's own command: the launcher is PID 1 there, and the only process the kubelet signals.
    proc = subprocess.Popen([sys.executable, *TRAINER_COMMAND[1:]], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_step(progress, 3, proc, timeout=120)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=90)
    finally:
        proc.kill()
    output = (tmp_path / "launcher.log").read_text()
    assert code == 143, output[-3000:]

    events = read_jsonl(progress)
    stopped = [e for e in events if e["event"] == "stopped"]
    assert len(stopped) == 1 and stopped[0]["signal"] == "SIGTERM", output[-3000:]
    step = stopped[0]["step"]
    assert 3 <= step < 100000
    assert not any(e["event"] in ("export", "finished") for e in events)
    # Both ranks stopped after the same step, and rank 0 saved exactly that step.
    assert [json.loads((records / f"rank{r}.json").read_text())["global_step"] for r in range(2)] == [step, step]
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", f"step={step:08d}.ckpt"]
    assert torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=False)["global_step"] == step
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [step]
    termination = json.loads((tmp_path / "termination-log").read_text())
    assert termination["stopped"] == "SIGTERM" and termination["ok"] is False
    assert "Traceback" not in output


def test_a_run_stopped_by_sigterm_resumes_to_the_uninterrupted_runs_weights(tmp_path: Path) -> None:
    """The checkpoint SIGTERM saves (a preemption, a suspend) is exact, in any epoch: resumed, the run trains
    on the same batches in the same order and ends with the weights of the same run never stopped. (In the
    second epoch, a resumed loader once fast-forwarded in the first epoch's order.)"""
    def config(run: str) -> dict[str, object]:
        return trainer_config(
            tmp_path / run,
            data={"classPath": "SyntheticImageDataModule",
                  "initArgs": {"image_size": 16, "num_classes": 4, "num_samples": 128, "pool_size": 128}},
            # The run to be stopped steps slowly: SIGTERM, sent once step 10 is reported, must land before step
            # 14 (maxSteps) on a loaded machine too, or the run ends first.
            model={"classPath": USER_MODEL, "initArgs": {"batch_log": str(tmp_path / f"{run}.batches"),
                                                         "step_sleep": 1.0 if run == "stopped" else 0.0}},
            trainer={"maxSteps": 14, "maxEpochs": 5, "numWorkers": 0},
            checkpoint={"everyNSteps": 4, "keepLast": 2},
            export={"onnx": {"enabled": False}},
        )

    def start(run: str) -> tuple[subprocess.Popen[str], Path]:
        progress = tmp_path / f"{run}.jsonl"
        env = process_env(**{
            contract.ENV_CONFIG: str(write_config(tmp_path, config(run), f"{run}.yaml")),
            contract.ENV_NNODES: "1", contract.ENV_NPROC_PER_NODE: "2", contract.ENV_NODE_RANK: "0",
            contract.ENV_MASTER_ADDR: "127.0.0.1", contract.ENV_MASTER_PORT: str(free_port()),
            contract.ENV_SHUTDOWN_TIMEOUT: "60", contract.ENV_PROGRESS_SINK: f"jsonl:{progress}",
        })
        log = (tmp_path / f"{run}.log").open("a")
        return subprocess.Popen([sys.executable, *TRAINER_COMMAND[1:]], env=env, stdout=log, stderr=subprocess.STDOUT,
                                text=True), progress

    whole, _ = start("whole")
    assert whole.wait(timeout=300) == 0, (tmp_path / "whole.log").read_text()[-3000:]
    stopped, progress = start("stopped")
    try:
        wait_for_step(progress, 10, stopped, timeout=180)  # in the second epoch
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(timeout=90) == 143
    finally:
        stopped.kill()
    saved = torch.load(tmp_path / "stopped" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] % 4 != 0 or saved["global_step"] >= 5  # SIGTERM's own checkpoint
    resumed, _ = start("stopped")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "stopped.log").read_text()[-3000:]

    def weights(run: str) -> dict[str, torch.Tensor]:
        checkpoint = torch.load(tmp_path / run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        assert checkpoint["global_step"] == 14
        return checkpoint["state_dict"]

    def batches(run: str) -> list[str]:
        return [line.rsplit(" ", 1)[0] for line in (tmp_path / f"{run}.batches.rank0").read_text().splitlines()]

    assert batches("stopped") == batches("whole")  # epoch, batch index and contents, in order
    expected, actual = weights("whole"), weights("stopped")
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_sigterm_to_one_rank_as_training_ends_stops_every_rank_with_the_final_checkpoint(tmp_path: Path) -> None:
    """Once the last step's checkpoint is written, SIGTERM reaches rank 1 alone: no rank may take it for
    Lightning's handler (a broadcast inside the handler, which deadlocked the ranks until torchrun's SIGKILL),
    and the ranks decide together to stop, not export (a rank stopping while another exports would wait)."""
    config = trainer_config(
        tmp_path,
        model={"classPath": USER_MODEL, "initArgs": {"sigterm_at_train_end": 1}},
        trainer={"maxSteps": 6, "numWorkers": 0},
        checkpoint={"everyNSteps": 4, "keepLast": 2},
    )
    progress = tmp_path / "progress.jsonl"
    env = process_env(**{
        contract.ENV_CONFIG: str(write_config(tmp_path, config)),
        contract.ENV_NNODES: "1", contract.ENV_NPROC_PER_NODE: "2", contract.ENV_NODE_RANK: "0",
        contract.ENV_MASTER_ADDR: "127.0.0.1", contract.ENV_MASTER_PORT: str(free_port()),
        contract.ENV_SHUTDOWN_TIMEOUT: "60", contract.ENV_PROGRESS_SINK: f"jsonl:{progress}",
    })
    started = time.monotonic()
    done = subprocess.run([sys.executable, *TRAINER_COMMAND[1:]], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    took = time.monotonic() - started
    events = read_jsonl(progress)
    assert [(e["event"], e["step"]) for e in events if e["event"] == "stopped"] == [("stopped", 6)], done.stderr[-3000:]
    assert not any(e["event"] in ("export", "finished") for e in events)
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"] == 6
    assert "Received SIGTERM" not in done.stderr  # Lightning's handler never ran
    assert "forcefully exiting" not in done.stderr and took < 120, done.stderr[-3000:]
    assert done.returncode != 0


# Two ranks create the stop flag's group as the trainer's setup does; rank 1 then never joins the flag's
# all-reduce (as a rank whose link was cut): rank 0's reduce must fail after the collective timeout.
_SILENT_PEER = """
import os, sys, time, types
from datetime import timedelta
import torch.distributed as dist
from dtrain_trainer.stopping import _GracefulStopBehaviour
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2, timeout=timedelta(seconds=2))
stop = _GracefulStopBehaviour(timedelta(seconds=2))
stop.setup(types.SimpleNamespace(world_size=2), None, "fit")
if rank == 1:
    time.sleep(120)
started = time.monotonic()
try:
    stop.any_rank_signalled()
except RuntimeError as exc:
    print(f"failed after {time.monotonic() - started:.1f} s: {exc}", flush=True)
    # Out at once: tearing down a gloo group whose peer never answered can abort the process ("terminate called
    # without an active exception"), which is gloo's teardown, not the wait this test measures.
    os._exit(3)
"""


def test_the_stop_flags_reduce_waits_no_longer_than_the_collective_timeout(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ranks = [
        subprocess.Popen([sys.executable, "-c", _SILENT_PEER, str(rank), str(store)], env=process_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)
    ]
    try:
        # Without the job's timeout on the flag's group, its default (30 minutes) would hold rank 0 here.
        out, _ = ranks[0].communicate(timeout=90)
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    assert ranks[0].returncode == 3, out
    assert "failed after" in out
