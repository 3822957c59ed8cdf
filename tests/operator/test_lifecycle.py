"""A DistributedTraining's life with a healthy cluster: children, Running, training success,
the engine Job, Succeeded with artifacts. The operator runs as a process against the API server."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from dtrain_operator.api import contract
from dtrain_operator.core.observation import parse_time
from tests.builders import SHARED_STORAGE, a_cpu_job

from .apiserver import now_rfc3339
from .cluster import Cluster
from .operator_process import OPERATOR_NAMESPACE

NS = "default"
pytestmark = pytest.mark.real_apiserver


def owned_by(obj: dict, job: dict) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return refs == [
        {
            "apiVersion": contract.API_VERSION,
            "kind": contract.KIND,
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def report_env(cluster: Cluster, rank: int) -> list[dict[str, str]]:
    """Every pod reaches the operator's report Service: rank 0 with its records, each pod's supervisor with its
    launch (the trainer sends records from global rank 0 only)."""
    url = f"https://dtrain-operator.{OPERATOR_NAMESPACE}.svc:{cluster.operators[-1].report_port}"
    return [{"name": "DTRAIN_PROGRESS_SINK", "value": "operator"}, {"name": "DTRAIN_OPERATOR_URL", "value": url}]


def assert_headless_service(cluster: Cluster, created: dict) -> None:
    """The job's Service: headless, publishing pods before they are ready, selecting its workers."""
    service = cluster.objects("v1/services", NS, "llm")[0]
    assert service["metadata"]["name"] == "llm"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {contract.LABEL_JOB_NAME: "llm", contract.LABEL_ROLE: "worker"}
    assert owned_by(service, created)


def assert_trainer_files(cluster: Cluster, pods: list[dict]) -> None:
    """The trainer's config, with the report endpoint's CA, in every pod alike (its annotations, mounted by the
    downward API); the gang's shape is not in it, and no ConfigMap is made for it."""
    annotations = [pod["metadata"]["annotations"] for pod in pods]
    files = {name: annotations[0][key] for name, key in contract.TRAINER_FILE_ANNOTATIONS.items()}
    assert all({name: a[key] for name, key in contract.TRAINER_FILE_ANNOTATIONS.items()} == files for a in annotations)
    config = yaml.safe_load(files[contract.CONFIG_FILE_NAME])
    assert "BEGIN CERTIFICATE" in files[contract.OPERATOR_CA_FILE_NAME]  # the report endpoint's CA
    assert config["jobName"] == "llm" and "nodes" not in config  # the gang's shape reaches the trainer as PET_* only
    (volume,) = [v for v in pods[0]["spec"]["volumes"] if v["name"] == contract.CONFIG_VOLUME]
    items = {item["path"]: item["fieldRef"]["fieldPath"] for item in volume["downwardAPI"]["items"]}
    assert items == {name: f"metadata.annotations['{key}']" for name, key in contract.TRAINER_FILE_ANNOTATIONS.items()}
    assert cluster.objects("v1/configmaps", NS, "llm") == []


def assert_worker_pod(cluster: Cluster, created: dict, rank: int, pod: dict) -> None:
    """One worker pod: its name, owner, labels, hostname, command, GPUs, the environment contract in order,
    and its volumes."""
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == f"llm-{rank}"
    assert owned_by(pod, created)
    assert {k: meta["labels"][k] for k in (contract.LABEL_JOB_NAME, contract.LABEL_ROLE, contract.LABEL_NODE_RANK,
                                            contract.LABEL_GANG_GENERATION)} == {
        contract.LABEL_JOB_NAME: "llm", contract.LABEL_ROLE: "worker",
        contract.LABEL_NODE_RANK: str(rank), contract.LABEL_GANG_GENERATION: "0",
    }
    assert (spec["hostname"], spec["subdomain"], spec["restartPolicy"]) == (f"llm-{rank}", "llm", "Never")
    (container,) = spec["containers"]
    assert container["command"] == ["python", "-m", "dtrain_trainer.supervisor", "-m", "dtrain_trainer"]
    assert quantities(container["resources"]["limits"]) == {"nvidia.com/gpu": "2"}
    assert container["env"] == [
        {"name": "PET_NNODES", "value": "3"},
        {"name": "PET_NPROC_PER_NODE", "value": "2"},
        {"name": "PET_NODE_RANK", "value": str(rank)},
        {"name": "PET_MASTER_ADDR", "value": "llm-0.llm.default.svc"},
        {"name": "PET_MASTER_PORT", "value": "29500"},
        # torchrun's wait for its workers after SIGTERM: the pod's grace period (600 s) less a margin.
        {"name": "PET_SHUTDOWN_TIMEOUT", "value": "590"},
        {"name": "DTRAIN_CONFIG", "value": "/etc/dtrain/config.yaml"},
        {"name": "DTRAIN_JOB_NAME", "value": "llm"},
        {"name": "DTRAIN_JOB_NAMESPACE", "value": "default"},
        {"name": "DTRAIN_POD_NAME", "value": f"llm-{rank}"},
        *report_env(cluster, rank),
        # A GPU job's flight recorder (its artifacts on object storage: no file for NCCL's own timeout dump).
        {"name": "TORCH_FR_BUFFER_SIZE", "value": "2000"},
        {"name": "TORCH_NCCL_DUMP_ON_TIMEOUT", "value": "1"},
        {"name": "NCCL_IB_DISABLE", "value": "1"},
        {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
        {"name": "DTRAIN_GANG_GENERATION", "value": "0"},  # the supervisor's first launch
        {"name": "DTRAIN_NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}},
        {"name": "WANDB_MODE", "value": "offline"},
    ]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert spec["automountServiceAccountToken"] is False
    assert contract.OPERATOR_TOKEN_VOLUME in volumes  # each pod's supervisor reports its launch
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    assert "downwardAPI" in volumes[contract.CONFIG_VOLUME]  # the trainer's files: assert_trainer_files


def quantities(resources: dict) -> dict[str, str]:
    """Resource quantities as a real server stores them (strings: 2 is "2")."""
    return {name: str(value) for name, value in resources.items()}


async def test_create_makes_service_and_pods_with_the_environment_contract(operated: Cluster):
    job = (
        a_cpu_job("llm")
        .with_nodes(3)
        .on_gpus(2)
        .with_spec(nccl={"ibDisable": True, "socketIfname": "eth0", "debug": "INFO",
                            "env": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}})
        .with_spec(env=[{"name": "WANDB_MODE", "value": "offline"}])
        .as_dict()
    )
    created = await operated.apply(job)
    pods = await operated.eventually(lambda: len(p := operated.pods(NS, "llm")) == 3 and p, "3 worker pods")

    assert_headless_service(operated, created)
    assert_trainer_files(operated, pods)
    for rank, pod in enumerate(pods):
        assert_worker_pod(operated, created, rank, pod)

    status = await operated.phase(NS, "llm", "Pending")
    assert status["nodesReady"] == "0/3"
    assert status["nodes"] == {"total": 3, "pending": 3, "running": 0, "succeeded": 0, "failed": 0}
    assert operated.condition(NS, "llm", "Created")["status"] == "True"
    assert status["observedGeneration"] == 1


async def test_scheduled_pods_make_it_starting_and_running_pods_running(operated: Cluster):
    await operated.apply(a_cpu_job("warmup").with_nodes(2).as_dict())
    pods = await operated.eventually(lambda: len(p := operated.pods(NS, "warmup")) == 2 and p, "2 pods")
    for pod in pods:
        await operated.schedule(NS, pod["metadata"]["name"])
    await operated.phase(NS, "warmup", "Starting")
    await operated.run(NS, "warmup-0")
    status = await operated.eventually(lambda: operated.status(NS, "warmup").get("nodesReady") == "1/2", "1/2 ready")
    await operated.run(NS, "warmup-1")
    status = await operated.phase(NS, "warmup", "Running")
    assert status["nodesReady"] == "2/2"
    assert operated.condition(NS, "warmup", "Running")["reason"] == "AllWorkersRunning"
    await operated.event_reasons(NS, "warmup", ["Running"])


async def test_training_success_builds_the_engine_and_reports_artifacts(operated: Cluster):
    await operated.apply(a_cpu_job("resnet").with_nodes(2).with_engine().as_dict())
    await operated.run_all(NS, "resnet", 2)
    await operated.phase(NS, "resnet", "Running")

    trainer_results = {"onnx": "/workspace/artifacts/model.onnx", "parityError": 2.1e-6, "epoch": 1}
    await operated.exit(NS, "resnet-1", 0)
    await operated.exit(NS, "resnet-0", 0, json.dumps(trainer_results))
    await operated.phase(NS, "resnet", "BuildingEngine")
    assert operated.condition(NS, "resnet", "TrainingSucceeded")["status"] == "True"
    # The phase is reported before the Job is created: wait for the Job itself.
    (engine_job,) = await operated.eventually(
        lambda: len(jobs := operated.objects("batch/v1/jobs", NS, "resnet")) == 1 and jobs, "the engine Job"
    )
    assert engine_job["metadata"]["name"] == "resnet-engine"
    assert engine_job["metadata"]["labels"][contract.LABEL_ROLE] == "engine"
    assert owned_by(engine_job, operated.job(NS, "resnet"))
    container = engine_job["spec"]["template"]["spec"]["containers"][0]
    # The per-job artifacts directory under the job's shared storage (tests/builders.py's SHARED_STORAGE).
    onnx = f"{SHARED_STORAGE['url']}/{NS}/resnet/artifacts/model.onnx"
    assert container["command"][:4] == ["dtrain", "build-engine", "--onnx", onnx]
    assert list(container["resources"]) == ["limits"] and quantities(container["resources"]["limits"]) == {"nvidia.com/gpu": "1"}
    assert engine_job["spec"]["backoffLimit"] == 1

    engine_results = {"kind": "engine", "engine": "/workspace/artifacts/model.plan", "precision": "fp16"}
    await operated.finish_engine_job(NS, "resnet", succeeded=True, message=json.dumps(engine_results))
    status = await operated.phase(NS, "resnet", "Succeeded")
    assert status["artifacts"] == {**trainer_results, **engine_results}
    assert status["completionTime"]
    assert operated.condition(NS, "resnet", "EngineBuilt")["status"] == "True"
    assert operated.condition(NS, "resnet", "Succeeded")["status"] == "True"
    assert operated.condition(NS, "resnet", "Running")["status"] == "False"
    await operated.event_reasons(NS, "resnet", ["Running", "BuildingEngine", "Succeeded"])
    # Where its time went, from its creation to its completion, counted no more once it finished.
    goodput, created = status["goodput"], operated.job(NS, "resnet")["metadata"]["creationTimestamp"]
    lifetime = (parse_time(status["completionTime"]) - parse_time(created)).total_seconds()
    assert sum(goodput["seconds"].values()) == pytest.approx(lifetime, abs=1.5), (goodput, created, status["startTime"], status["completionTime"])
    assert {"starting", "engine"} <= set(goodput["seconds"]) and "current" not in goodput
    # cleanPodPolicy Running (the default) keeps pods that exited: their logs are still there.
    assert len(operated.pods(NS, "resnet")) == 2


async def test_training_success_without_the_engine_is_success(operated: Cluster):
    await operated.apply(a_cpu_job("plain").with_nodes(2).without_engine().as_dict())
    await operated.run_all(NS, "plain", 2)
    await operated.phase(NS, "plain", "Running")
    await operated.exit(NS, "plain-0", 0, '{"onnx": "/workspace/artifacts/model.onnx"}')
    status = await operated.phase(NS, "plain", "Succeeded")
    assert status["artifacts"] == {"onnx": "/workspace/artifacts/model.onnx"}
    assert operated.objects("batch/v1/jobs", NS, "plain") == []
    # rank 1 was still running: cleanPodPolicy Running deletes it, rank 0's pod stays.
    await operated.eventually(lambda: [p["metadata"]["name"] for p in operated.pods(NS, "plain")] == ["plain-0"],
                              "only the finished pod left")


async def test_engine_failure_fails_the_job_with_the_pod_message(operated: Cluster):
    await operated.apply(a_cpu_job("broken").with_nodes(1).with_engine().as_dict())
    await operated.run_all(NS, "broken", 1)
    await operated.exit(NS, "broken-0", 0)
    await operated.phase(NS, "broken", "BuildingEngine")
    await operated.finish_engine_job(NS, "broken", succeeded=False, message="parity check failed: max error 0.31")
    await operated.phase(NS, "broken", "Failed")
    failed = operated.condition(NS, "broken", "Failed")
    assert failed["reason"] == "EngineBuildFailed"
    assert "parity check failed: max error 0.31" in failed["message"]


async def test_exporting_phase_follows_the_trainer_and_progress_is_never_overwritten(operated: Cluster):
    await operated.apply(a_cpu_job("export").with_nodes(2).as_dict())
    await operated.run_all(NS, "export", 2)
    await operated.phase(NS, "export", "Running")
    await asyncio.sleep(1.1)  # reported at least a second after the gang's pods were created
    progress = {"epoch": 3, "step": 1200, "loss": 0.42, "imagesPerSecond": 880.5, "updatedAt": now_rfc3339(),
                "stage": "exporting"}
    await operated.patch_job_status(NS, "export", {"progress": progress, "lastCheckpoint": {"step": 1200}})
    await operated.phase(NS, "export", "Exporting")
    await operated.exit(NS, "export-1", 0)
    await operated.exit(NS, "export-0", 0)
    status = await operated.phase(NS, "export", "Succeeded")
    assert status["progress"] == progress
    assert status["lastCheckpoint"] == {"step": 1200}
