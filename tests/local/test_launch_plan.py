"""What `dtrain run` starts for each node, decided by the operator's own rules (no processes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dtrain_operator.api import contract
from dtrain_operator.core import render
from dtrain_operator.local.launch_plan import (
    Overrides,
    PlanError,
    Workdir,
    assign_gpus,
    engine_argv,
    failure_excerpt,
    local_command,
    local_site,
    localize,
    node_launches,
    omp_threads,
    termination_message,
    user_env,
    worker_exit_code,
)
from tests.builders import a_job

DEMO = a_job("demo").in_namespace("ml").without_storage()  # a local job file: its paths move into the workdir
"""The job `dtrain run` runs here: every spec field at its default unless a test says otherwise."""


WORKDIR = Workdir(Path("/runs/demo"))


def test_paths_move_into_the_workdir_and_overrides_apply() -> None:
    local = localize(DEMO.with_nodes(4).on_cpu().as_model(), Overrides(nodes=2, devices_per_node=3), WORKDIR, [])
    spec = local.job.spec
    assert (spec.nodes, spec.devices_per_node) == (2, 3)
    assert spec.checkpoint.dir == "/runs/demo/checkpoints"
    assert spec.artifacts.dir == "/runs/demo/artifacts"
    config = render.trainer_config(local.job)
    assert config["checkpoint"]["dir"] == "/runs/demo/checkpoints"
    assert config["artifacts"]["dir"] == "/runs/demo/artifacts"
    launches, _ = node_launches(local, WORKDIR, 29999, {}, cores=8)
    assert [(launch.env["PET_NNODES"], launch.env["PET_NPROC_PER_NODE"]) for launch in launches] == [("2", "3")] * 2
    assert local.warnings == []


def test_gpu_without_cuda_falls_back_to_cpu_with_one_warning() -> None:
    job = DEMO.with_spec(accelerator="gpu", trainer={"precision": "16-mixed"}).as_model()
    local = localize(job, Overrides(), WORKDIR, [])
    assert local.job.spec.accelerator == "cpu"
    assert len(local.warnings) == 1
    assert "no CUDA device" in local.warnings[0] and "16-mixed falls back to 32-true" in local.warnings[0]
    assert render.trainer_config(local.job)["accelerator"] == "cpu"


def test_gpus_are_split_between_nodes_and_too_few_is_an_error() -> None:
    assert assign_gpus(2, 2, ["0", "1", "2", "3"]) == [["0", "1"], ["2", "3"]]
    assert assign_gpus(1, 1, ["5", "7"]) == [["5"]]
    with pytest.raises(PlanError, match=r"needs 4 GPU\(s\).*has 2.*--nodes"):
        assign_gpus(2, 2, ["0", "1"])
    local = localize(DEMO.with_nodes(2).with_devices(1).as_model(), Overrides(), WORKDIR, ["0", "1"])
    launches, _ = node_launches(local, WORKDIR, 29999, {}, cores=8)
    assert [launch.env["CUDA_VISIBLE_DEVICES"] for launch in launches] == ["0", "1"]


def test_volume_mounts_are_named_as_unmounted() -> None:
    job = DEMO.on_cpu().with_spec(
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}],
        volumeMounts=[{"name": "data", "mountPath": "/data/imagenet"}],
    ).as_model()
    assert localize(job, Overrides(), WORKDIR, []).warnings == [
        (
            "volumeMount data at /data/imagenet is not mounted outside a cluster: the trainer reads that path on this "
            "machine as it is"
        )
    ]


def test_bad_overrides_are_refused() -> None:
    with pytest.raises(PlanError, match="--nodes must be at least 1"):
        localize(DEMO.as_model(), Overrides(nodes=0), WORKDIR, [])


def test_each_node_runs_the_rendered_pod_with_its_environment() -> None:
    job = DEMO.with_nodes(2).on_cpu().with_spec(
        nccl={"debug": "WARN"},
        env=[
            {"name": "MY_FLAG", "value": "1"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ],
    ).as_model()
    local = localize(job, Overrides(), WORKDIR, [])
    base = {"PATH": "/usr/bin", "PET_NNODES": "9", "RANK": "3", "HOME": "/root"}
    launches, warnings = node_launches(local, WORKDIR, 31234, base, cores=2)
    assert [launch.rank for launch in launches] == [0, 1]
    for launch in launches:
        env = launch.env
        assert launch.argv == [sys.executable, "-m", "dtrain_trainer.launch", "-m", "dtrain_trainer"]
        assert env[contract.ENV_NODE_RANK] == str(launch.rank)
        assert env[contract.ENV_NNODES] == "2"
        assert env[contract.ENV_MASTER_ADDR] == "127.0.0.1"
        assert env[contract.ENV_MASTER_PORT] == "31234"
        assert env[contract.ENV_CONFIG] == "/runs/demo/config.yaml"
        assert env[contract.ENV_PROGRESS_SINK] == "jsonl:/runs/demo/progress.jsonl"
        assert env[contract.ENV_TERMINATION_LOG] == f"/runs/demo/logs/node-{launch.rank}.termination.json"
        assert env[contract.ENV_JOB_NAMESPACE] == "ml"
        assert env["NCCL_DEBUG"] == "WARN"
        assert env["MY_FLAG"] == "1"
        assert env["POD"] == f"demo-{launch.rank}"
        assert "TOKEN" not in env
        # Inherited variables pass through; a surrounding launcher's do not.
        assert env["PATH"] == "/usr/bin" and "RANK" not in env
        assert env["OMP_NUM_THREADS"] == "1"
    assert warnings == ["env TOKEN: secretKeyRef cannot be resolved outside a cluster; it is not set locally"]


def test_omp_threads_from_the_job_then_the_caller_then_the_cores() -> None:
    local = localize(DEMO.on_cpu().with_devices(2).as_model(), Overrides(), WORKDIR, [])
    assert node_launches(local, WORKDIR, 29500, {}, cores=16)[0][0].env["OMP_NUM_THREADS"] == "8"
    assert node_launches(local, WORKDIR, 29500, {"OMP_NUM_THREADS": "3"}, cores=16)[0][0].env["OMP_NUM_THREADS"] == "3"
    job = DEMO.on_cpu().with_spec(env=[{"name": "OMP_NUM_THREADS", "value": "7"}]).as_model()
    local = localize(job, Overrides(), WORKDIR, [])
    launches, _ = node_launches(local, WORKDIR, 29500, {"OMP_NUM_THREADS": "3"}, cores=2)
    assert launches[0].env["OMP_NUM_THREADS"] == "7"


@pytest.mark.parametrize("cores, processes, threads", [(2, 2, 1), (2, 4, 1), (16, 4, 4), (1, 1, 1), (7, 2, 3)])
def test_omp_threads_share_the_cores(cores: int, processes: int, threads: int) -> None:
    assert omp_threads(cores, processes) == threads


def test_user_env_answers_the_downward_api_for_one_machine() -> None:
    job = DEMO.with_spec(
        env=[
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
        ]
    ).as_model()
    values, warnings = user_env(job, 1)
    assert values == {"NS": "ml", "IP": "127.0.0.1"}
    assert [w.split(":")[0] for w in warnings] == ["env CPU", "env CM"]


def test_a_node_launches_with_the_pods_own_environment_where_only_the_site_differs() -> None:
    """One source: every variable the operator renders into a worker pod as a value reaches the local node with
    the same value, except those of the site (rank 0's address, the config path, the records' sink)."""
    job = DEMO.with_nodes(2).with_devices(2).on_cpu().with_spec(
        nccl={"debug": "INFO", "socketIfname": "lo"}, storage={"url": "s3://bucket/jobs", "s3": {"endpoint": "http://s3:9000"}}
    ).as_model()
    local = localize(job, Overrides(), WORKDIR, [])
    launches, _ = node_launches(local, WORKDIR, 29999, {}, cores=4)
    site = local_site(WORKDIR, 29999, rank=1)
    differs = {
        contract.ENV_MASTER_ADDR: site.master_addr,
        contract.ENV_MASTER_PORT: str(site.master_port),
        contract.ENV_CONFIG: site.config_path,
        contract.ENV_PROGRESS_SINK: site.progress_sink,
    }
    pod = render.render_worker_pod(local.job, rank=1)["spec"]["containers"][0]
    for var in pod["env"]:
        if "value" in var and var["name"] != contract.ENV_GANG_GENERATION:  # the pod's supervisor's alone
            assert launches[1].env[var["name"]] == differs.get(var["name"], var["value"]), var["name"]
    assert launches[1].env[contract.ENV_NODE_NAME]  # the downward API's spec.nodeName: this machine
    # A node runs the launcher the pod's supervisor runs (dtrain run restarts its processes itself).
    assert local_command(render.TRAINER_COMMAND) == launches[1].argv


def test_engine_step_is_the_engine_jobs_command_on_the_workdir() -> None:
    job = DEMO.on_cpu().with_spec(engine={"maxBatch": 8, "optBatch": 4}).as_model()
    local = localize(job, Overrides(), WORKDIR, [])
    argv = engine_argv(local.job, WORKDIR)
    assert argv[:4] == [sys.executable, "-m", "dtrain_operator.cli", "build-engine"]
    assert argv[argv.index("--onnx") + 1] == "/runs/demo/artifacts/model.onnx"
    assert argv[argv.index("--report") + 1] == "/runs/demo/artifacts/engine-report.json"
    assert argv[argv.index("--opt-batch") + 1] == "4"
    assert argv[argv.index("--fallback") + 1] == "onnxruntime"
    assert argv[argv.index("--pytorch-checkpoint") + 1] == "/runs/demo/checkpoints/last.ckpt"
    assert argv[argv.index("--model-config") + 1] == "/runs/demo/config.yaml"


TORCHRUN_REPORT = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
dtrain_trainer FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-01-01_00:00:00
  host      : box
  rank      : 1 (local_rank: 0)
  exitcode  : {code} (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================
"""


@pytest.mark.parametrize(
    "returncode, expected",
    [
        (137, 137),  # the launcher passed on a worker killed by SIGKILL
        (3, 3),  # the worker's own error
        (-15, 143),  # the launcher itself killed by SIGTERM
    ],
)
def test_worker_exit_code_follows_the_pod_convention(returncode: int, expected: int) -> None:
    assert worker_exit_code(returncode) == expected


def test_failure_excerpt_keeps_the_last_lines() -> None:
    log = "\n".join(["starting", "RuntimeError: the model failed", TORCHRUN_REPORT.format(code=1)])
    assert "RuntimeError: the model failed" in failure_excerpt(log, lines=1000)
    assert failure_excerpt(log, lines=2).splitlines()[-1].startswith("=====")


def test_a_nodes_termination_message_is_a_pods_with_fallback_to_logs_on_error() -> None:
    """What failure rules' onTerminationMessage reads: the trainer's own message, else the end of the log (at
    most 80 lines and 2048 bytes, as the kubelet takes it for terminationMessagePolicy FallbackToLogsOnError)."""
    log = "".join(f"line {i}\n" for i in range(200)) + "RuntimeError: CUDA error\n"
    assert termination_message('{"ok":false,"error":"bad"}', log) == '{"ok":false,"error":"bad"}'
    fallback = termination_message("", log)
    assert fallback.splitlines()[0] == "line 121" and fallback.endswith("RuntimeError: CUDA error")
    long_lines = "x" * 5000 + "\nend"
    assert termination_message("  \n", long_lines) == ("x" * 5000 + "\nend")[-2048:]
    assert termination_message("é" * 3000, "").encode() == ("é" * 2048).encode()


def test_object_storage_stays_where_the_spec_puts_it() -> None:
    """`dtrain run` moves paths into the workdir, but an s3:// or gs:// directory is the same bucket from here."""
    job = DEMO.with_spec(storage={"url": "s3://bucket/jobs"}, artifacts={"dir": "/data/out"}).as_model()
    local = localize(job, Overrides(), Workdir(Path("/runs/demo")), [])
    assert local.job.spec.checkpoint.dir == "s3://bucket/jobs/ml/demo/checkpoints"
    assert local.job.spec.artifacts.dir == "/runs/demo/artifacts"
    assert "--pytorch-checkpoint" not in engine_argv(local.job, Workdir(Path("/runs/demo")))
