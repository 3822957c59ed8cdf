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

from .conftest import USER_MODEL, free_port, process_env, read_jsonl, trainer_config, write_config

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
