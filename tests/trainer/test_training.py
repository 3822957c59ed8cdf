"""Real training runs: torchrun "nodes" with gloo, a gang restart from a checkpoint, the built-in classifier.

Each run is a real process tree started the way a pod (or `dtrain run`) starts it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from dtrain_operator.api import DistributedTraining, contract
from dtrain_operator.api.records import status_patch
from dtrain_operator.core.render import render_worker_pod, trainer_files, worker_env

from ..ports import free_port
from .conftest import (
    RUN_TIMEOUT_SECONDS,
    USER_DATA,
    USER_MODEL,
    process_env,
    read_jsonl,
    run_trainer,
    trainer_config,
    write_config,
)
from .user_code.dtrain_test_user import CRASH_EXIT_CODE

pytestmark = pytest.mark.slow


def checkpoint_step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])


def pod_environment(job: DistributedTraining, rank: int) -> dict[str, str]:
    """The trainer container's environment as the operator renders it (its values; no downward API here)."""
    return {var["name"]: var["value"] for var in worker_env(job, rank) if "value" in var}


def two_node_job(tmp_path: Path) -> DistributedTraining:
    return DistributedTraining.model_validate(
        {
            "apiVersion": contract.API_VERSION,
            "kind": contract.KIND,
            "metadata": {"name": "two-nodes", "namespace": "team-a"},
            "spec": {
                "nodes": 2,
                "devicesPerNode": 1,
                "accelerator": "cpu",
                "model": {"classPath": USER_MODEL, "initArgs": {"record_dir": str(tmp_path / "records")}},
                "data": {"classPath": USER_DATA, "initArgs": {"num_samples": 64, "image_size": 16}},
                "trainer": {"maxEpochs": 5, "maxSteps": 6, "batchSize": 8, "numWorkers": 0, "logEveryNSteps": 1},
                "checkpoint": {"dir": str(tmp_path / "checkpoints"), "everyNSteps": 3, "keepLast": 1},
                "artifacts": {"dir": str(tmp_path / "artifacts")},
            },
        }
    )


def start_rendered_pods(job: DistributedTraining, tmp_path: Path, progress: Path) -> list[subprocess.Popen[str]]:
    """The pods as the operator renders them, on this machine: the trainer's config file and each pod's own
    command and environment, with the rendezvous on 127.0.0.1."""
    config_path = tmp_path / contract.CONFIG_FILE_NAME
    config_path.write_text(trainer_files(job)[contract.CONFIG_FILE_NAME])
    port = free_port()
    processes = []
    for rank in range(2):
        container = render_worker_pod(job, rank)["spec"]["containers"][0]
        command = [sys.executable, *container["command"][1:]]
        env = pod_environment(job, rank)
        assert env[contract.ENV_NODE_RANK] == str(rank) and env[contract.ENV_NNODES] == "2"
        env.update(
            {
                contract.ENV_MASTER_ADDR: "127.0.0.1",
                contract.ENV_MASTER_PORT: str(port),
                contract.ENV_CONFIG: str(config_path),
                contract.ENV_PROGRESS_SINK: f"jsonl:{progress}",
                contract.ENV_TERMINATION_LOG: str(tmp_path / f"termination-log-{rank}"),
            }
        )
        log = (tmp_path / f"node-{rank}.log").open("w")
        processes.append(
            subprocess.Popen(command, env=process_env(**env), stdout=log, stderr=subprocess.STDOUT, text=True)
        )
    return processes


def assert_one_world_of_two_in_sync(tmp_path: Path) -> None:
    """Both ranks trained in one world of two, on different data, and ended with the same weights."""
    records = [json.loads((tmp_path / "records" / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in records] == [2, 2]
    assert [r["global_step"] for r in records] == [6, 6]
    assert records[0]["first_batch"] != records[1]["first_batch"]
    assert records[0]["start_weights"] == records[1]["start_weights"]
    assert records[0]["end_weights"] != records[0]["start_weights"]
    assert records[0]["end_weights"] == records[1]["end_weights"]


def assert_checkpoints_and_artifacts(tmp_path: Path) -> dict[str, Any]:
    """The step-6 checkpoint and last.ckpt, and the artifacts: the ONNX export with its parity check."""
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "step=00000006.ckpt"]
    assert checkpoint_step(checkpoints / "last.ckpt") == 6
    artifacts = json.loads((tmp_path / "artifacts" / contract.ARTIFACTS_FILE_NAME).read_text())
    assert Path(artifacts["onnx"]["path"]) == tmp_path / "artifacts" / contract.ONNX_FILE_NAME
    assert artifacts["parity"]["ok"] and artifacts["metrics"]["step"] == 6
    return artifacts


def assert_rank_zero_reported(tmp_path: Path, progress: Path, artifacts: dict[str, Any]) -> None:
    """Rank 0's progress records (start, checkpoints, throughput, export, finished) and its termination log."""
    events = read_jsonl(progress)
    start = next(e for e in events if e["event"] == "start")
    assert (start["worldSize"], start["nodes"], start["resumeFrom"]) == (2, 2, None)
    assert start["clusterEnvironment"] == "TorchElasticEnvironment"  # detected by Lightning from torchrun
    # Rank 0 alone reports: one start, one export.
    assert [e["event"] for e in events].count("start") == 1
    assert [e["event"] for e in events][-2:] == ["export", "finished"]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [3, 6]
    rates = [e["imagesPerSecond"] for e in events if e["event"] == "progress" and e["imagesPerSecond"]]
    assert rates, "no throughput after warm-up"
    summary = json.loads((tmp_path / "termination-log-0").read_text())
    assert summary["ok"] is True and summary["onnx"] == artifacts["onnx"]["path"]


def test_two_torchrun_nodes_train_in_sync(tmp_path: Path) -> None:
    job = two_node_job(tmp_path)
    progress = tmp_path / "progress.jsonl"
    processes = start_rendered_pods(job, tmp_path, progress)
    try:
        codes = [p.wait(timeout=RUN_TIMEOUT_SECONDS) for p in processes]
    finally:
        for p in processes:
            p.kill()
    logs = {rank: (tmp_path / f"node-{rank}.log").read_text() for rank in range(2)}
    assert codes == [0, 0], logs

    assert_one_world_of_two_in_sync(tmp_path)
    artifacts = assert_checkpoints_and_artifacts(tmp_path)
    assert_rank_zero_reported(tmp_path, progress, artifacts)


def test_gang_restart_resumes_from_the_saved_step(tmp_path: Path) -> None:
    model_args = {
        "record_dir": str(tmp_path / "records"),
        "crash_at_step": 5,
        "crash_marker": str(tmp_path / "crashed-once"),
    }
    config = trainer_config(
        tmp_path,
        model={"classPath": USER_MODEL, "initArgs": model_args},
        trainer={"maxSteps": 8, "maxEpochs": 1},
        checkpoint={"everyNSteps": 2, "keepLast": 2},
    )
    path = write_config(tmp_path, config)
    progress = tmp_path / "progress.jsonl"

    first = run_trainer(path, DTRAIN_PROGRESS_SINK=f"jsonl:{progress}")
    assert first.returncode == CRASH_EXIT_CODE, first.stderr
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "step=00000002.ckpt", "step=00000004.ckpt"]
    assert checkpoint_step(checkpoints / "last.ckpt") == 4

    # The restarted gang's records, as the operator would write them into the job's status.
    resumed = tmp_path / "resumed.jsonl"
    second = run_trainer(path, DTRAIN_PROGRESS_SINK=f"jsonl:{resumed}")
    assert second.returncode == 0, second.stderr
    assert f"resumed from {checkpoints / 'last.ckpt'} at step 4" in second.stderr
    record = json.loads((tmp_path / "records" / "rank0.json").read_text())
    assert record["global_step"] == 8
    # keepLast counts across the restart: the first run's step files are rotated out.
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "step=00000006.ckpt", "step=00000008.ckpt"]
    assert checkpoint_step(checkpoints / "last.ckpt") == 8

    records = [json.loads(line) for line in resumed.read_text().splitlines()]
    patches = [patch for patch in map(status_patch, records) if patch is not None]
    progress_steps = [p["progress"]["step"] for p in patches if "progress" in p]
    assert progress_steps and min(progress_steps) >= 4 and max(progress_steps) == 8
    # Rank 0 says it is exporting (the operator shows the Exporting phase) after training's last step.
    stages = [p["progress"].get("stage") for p in patches if "progress" in p]
    assert stages[-1] == contract.PROGRESS_STAGE_EXPORTING and contract.PROGRESS_STAGE_TRAINING in stages
    checkpoint_patches = [p["lastCheckpoint"] for p in patches if "lastCheckpoint" in p]
    assert checkpoint_patches[-1]["step"] == 8
    assert checkpoint_patches[-1]["path"] == str(checkpoints / "step=00000008.ckpt")


def test_builtin_classifier_with_accumulation_clipping_and_cpu_fallback(tmp_path: Path) -> None:
    config = trainer_config(
        tmp_path,
        model={"classPath": "ImageClassifier", "initArgs": {"arch": "resnet18", "num_classes": 4, "optimizer": "sgd"}},
        data={"classPath": "SyntheticImageDataModule", "initArgs": {"image_size": 32, "num_classes": 4, "num_samples": 64}},
        trainer={
            "maxSteps": -1,
            "maxEpochs": 1,
            "limitTrainBatches": 4,
            "accumulateGradBatches": 2,
            "gradientClipVal": 0.5,
            "precision": "16-mixed",
        },
        checkpoint={"everyNSteps": 100, "keepLast": 1},
        logging={"logger": "csv"},
    )
    progress = tmp_path / "progress.jsonl"
    termination_log = tmp_path / "termination-log"
    run = run_trainer(
        write_config(tmp_path, config),
        DTRAIN_PROGRESS_SINK=f"jsonl:{progress}",
        DTRAIN_TERMINATION_LOG=str(termination_log),
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("16-mixed needs a CUDA GPU") == 1

    events = read_jsonl(progress)
    start = next(e for e in events if e["event"] == "start")
    assert start["precision"] == "32-true"
    # Four batches accumulated two at a time: two optimizer steps.
    last_progress = [e for e in events if e["event"] == "progress"][-1]
    assert (last_progress["step"], last_progress["totalSteps"]) == (2, 2)
    assert checkpoint_step(tmp_path / "checkpoints" / "last.ckpt") == 2

    artifacts: dict[str, Any] = json.loads((tmp_path / "artifacts" / contract.ARTIFACTS_FILE_NAME).read_text())
    assert artifacts["onnx"]["opset"] == 17 and artifacts["onnx"]["inputShape"] == [3, 32, 32]
    assert artifacts["parity"]["maxRelativeError"] <= 1e-3
    summary = json.loads(termination_log.read_text())
    assert summary["ok"] is True and summary["step"] == 2
    assert summary["parityError"] == artifacts["parity"]["maxRelativeError"]
    # The CSV metrics Lightning logged every step (logging.logger csv; TensorBoard is the default).
    metrics = (tmp_path / "artifacts" / "logs" / "version_0" / "metrics.csv").read_text()
    assert "train_loss" in metrics
    assert yaml.safe_load((tmp_path / "artifacts" / "logs" / "version_0" / "hparams.yaml").read_text())["arch"] == "resnet18"
