"""The pre-flight gang check, with two torchrun "nodes" on the CPU started as the operator renders them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dtrain_operator.api import DistributedTraining, contract
from dtrain_operator.core.render import render_worker_pod, trainer_files
from dtrain_trainer.preflight import interfaces, missing_interfaces

from ..ports import free_port
from .conftest import RUN_TIMEOUT_SECONDS, USER_DATA, USER_MODEL, process_env, read_jsonl
from .test_training import pod_environment

SLOW_START = Path(__file__).parent / "slow_start"


def job(tmp_path: Path, preflight_timeout: int = 30) -> DistributedTraining:
    return DistributedTraining.model_validate(
        {
            "apiVersion": contract.API_VERSION,
            "kind": contract.KIND,
            "metadata": {"name": "pf", "namespace": "team-a"},
            "spec": {
                "nodes": 2,
                "accelerator": "cpu",
                "model": {"classPath": USER_MODEL},
                "data": {"classPath": USER_DATA, "initArgs": {"num_samples": 32, "image_size": 8}},
                "trainer": {"maxSteps": 2, "batchSize": 8, "numWorkers": 0},
                "checkpoint": {"dir": str(tmp_path / "checkpoints"), "everyNSteps": 2},
                "artifacts": {"dir": str(tmp_path / "artifacts")},
                "export": {"onnx": {"enabled": False}},
                "engine": {"enabled": False},
                "nccl": {"preflightTimeoutSeconds": preflight_timeout},
            },
        }
    )


def run_nodes(tmp_path: Path, spec: DistributedTraining, extra: dict[int, dict[str, str]]) -> dict[str, Any]:
    config_path = tmp_path / contract.CONFIG_FILE_NAME
    config_path.write_text(trainer_files(spec)[contract.CONFIG_FILE_NAME])
    port = free_port()
    progress = tmp_path / "progress.jsonl"
    processes = []
    started = time.monotonic()
    for rank in range(2):
        command = [sys.executable, *render_worker_pod(spec, rank)["spec"]["containers"][0]["command"][1:]]
        env = pod_environment(spec, rank)
        env.update(
            {
                contract.ENV_MASTER_ADDR: "127.0.0.1",
                contract.ENV_MASTER_PORT: str(port),
                contract.ENV_CONFIG: str(config_path),
                contract.ENV_PROGRESS_SINK: f"jsonl:{progress}",
                contract.ENV_TERMINATION_LOG: str(tmp_path / f"termination-log-{rank}"),
                contract.ENV_POD_NAME: f"pf-{rank}",
                contract.ENV_NODE_NAME: f"node-{rank}",
            }
        )
        env = process_env(**env)
        env.update(extra.get(rank, {}))
        log = (tmp_path / f"node-{rank}.log").open("w")
        processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True))
    try:
        codes = [p.wait(timeout=RUN_TIMEOUT_SECONDS) for p in processes]
    finally:
        for p in processes:
            p.kill()
    return {
        "codes": codes,
        "seconds": time.monotonic() - started,
        "logs": {r: (tmp_path / f"node-{r}.log").read_text() for r in range(2)},
        "records": read_jsonl(progress) if progress.exists() else [],
        "termination": {
            r: (tmp_path / f"termination-log-{r}").read_text() if (tmp_path / f"termination-log-{r}").exists() else ""
            for r in range(2)
        },
    }


def test_interface_syntax() -> None:
    present = ["eth0", "lo", "veth12"]
    assert missing_interfaces("eth0", present) == []
    assert missing_interfaces("eth", present) == []  # a prefix, as NCCL reads it
    assert missing_interfaces("ib0,eth", present) == []
    assert missing_interfaces("ib0", present) == ["ib0"]
    assert missing_interfaces("=eth", present) == ["eth"]
    assert missing_interfaces("^lo,docker", present) == []
    assert "lo" in interfaces()


@pytest.mark.slow
def test_a_healthy_gang_reports_latency_and_bus_bandwidth(tmp_path: Path) -> None:
    run = run_nodes(tmp_path, job(tmp_path), {})
    assert run["codes"] == [0, 0], run["logs"]
    checks = [r for r in run["records"] if r["event"] == "preflight"]
    assert len(checks) == 1
    check = checks[0]
    assert (check["backend"], check["worldSize"], check["allReduceBytes"]) == ("gloo", 2, 4 * 1024 * 1024)
    assert check["latencyMs"] > 0 and check["busBandwidthGBps"] > 0 and 0 < check["seconds"] < 30
    assert check["versions"]["torch"]
    assert [(r["pod"], r["node"]) for r in check["ranks"]] == [("pf-0", "node-0"), ("pf-1", "node-1")]
    # It came before the model was built and trained.
    events = [r["event"] for r in run["records"]]
    assert events.index("preflight") < events.index("start")


@pytest.mark.slow
def test_an_interface_the_pod_lacks_fails_at_once_naming_rank_and_interface(tmp_path: Path) -> None:
    run = run_nodes(tmp_path, job(tmp_path), {1: {"GLOO_SOCKET_IFNAME": "ens9f7"}})
    assert run["codes"][1] == contract.TRAINER_EXIT_INVALID_CONFIG, run["logs"]
    message = json.loads(run["termination"][1])["error"]
    assert "rank 1 (pod pf-1 on node node-1)" in message
    assert "GLOO_SOCKET_IFNAME=ens9f7" in message and "lo" in message
    # Rank 0 does not wait for the collective timeout either: it names rank 1 as missing.
    assert run["codes"][0] != 0
    assert run["seconds"] < 90


@pytest.mark.slow
def test_a_rank_that_does_not_join_in_time_is_named(tmp_path: Path) -> None:
    slow = {"PYTHONPATH": f"{SLOW_START}:{process_env()['PYTHONPATH']}", "DTRAIN_TEST_SLOW_START": "30"}
    run = run_nodes(tmp_path, job(tmp_path, preflight_timeout=5), {1: slow})
    assert run["codes"][0] == contract.TRAINER_EXIT_INVALID_CONFIG, run["logs"]
    message = json.loads(run["termination"][0])["error"]
    assert "rank 1 (node 1) did not join within 5 s at 127.0.0.1:" in message
    assert "MASTER_ADDR" in message
