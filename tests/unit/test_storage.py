"""Where checkpoints and artifacts live (api/storage.py): per-job defaults, object-storage URLs, the refusal of a
job without shared storage (the model's line, `dtrain validate` and the CRD say the same), and what the pods get."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain_operator.api import TrainerConfig, job_dirs
from dtrain_operator.api.job_defaults import JobDefaults
from dtrain_operator.api.validation import EXIT_INVALID_JOB, load_job, validate_object, validate_text
from dtrain_operator.core import engine_job, render
from tests.builders import a_job
from tests.kube_admission import KubeAdmission

FIX = "set spec.storage.claimName (a ReadWriteMany PVC) or spec.storage.url (s3://bucket/prefix or gs://bucket/prefix)"


def no_storage(**spec: object) -> dict:
    return {"apiVersion": "dtrain.dev/v1alpha1", "kind": "DistributedTraining", "metadata": {"name": "quick"},
            "spec": {"accelerator": "cpu", **spec}}


# --- Per-job defaults ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "checkpoints", "artifacts"),
    [
        ({"storage": {"claimName": "shared"}}, "/workspace/ml/mnist/checkpoints", "/workspace/ml/mnist/artifacts"),
        ({"storage": {"claimName": "shared", "mountPath": "/mnt/s"}}, "/mnt/s/ml/mnist/checkpoints", "/mnt/s/ml/mnist/artifacts"),
        ({"storage": {"url": "s3://bucket/teams/vision"}}, "s3://bucket/teams/vision/ml/mnist/checkpoints",
         "s3://bucket/teams/vision/ml/mnist/artifacts"),
        ({"storage": {"url": "gs://bucket"}, "checkpoint": {"dir": "/data/ckpt"}}, "/data/ckpt", "gs://bucket/ml/mnist/artifacts"),
    ],
    ids=["claim", "claim-mount-path", "s3-prefix", "explicit-dir-wins"],
)
def test_default_directories_are_per_job(spec: dict, checkpoints: str, artifacts: str) -> None:
    job = a_job("mnist").in_namespace("ml").with_spec(**spec).as_model()
    config = TrainerConfig.from_job(job)
    assert (config.checkpoint.dir, config.artifacts.dir) == (checkpoints, artifacts)


def test_two_jobs_on_one_claim_never_share_a_directory() -> None:
    first, second = (a_job(name).with_spec(storage={"claimName": "shared"}).as_model() for name in ("first", "second"))
    assert TrainerConfig.from_job(first).checkpoint.dir != TrainerConfig.from_job(second).checkpoint.dir
    assert engine_job.engine_command(first) != engine_job.engine_command(second)


@pytest.mark.parametrize(
    "url", ["s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMIK7MDENG@bucket/x", "s3://user:hunter2hunter2@bucket", "http://bucket/x"]
)
def test_a_url_with_credentials_or_another_scheme_is_refused_without_echoing_them(url: str) -> None:
    result = validate_object(no_storage(checkpoint={"dir": url}, engine={"enabled": False}))
    assert result.job is None
    text = "\n".join(result.errors)
    assert "checkpoint.dir" in text
    assert "hunter2" not in text and "wJalrXUtnFEMIK7MDENG" not in text


# --- No shared storage -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "needs"),
    [
        ({"nodes": 2, "engine": {"enabled": False}}, "its 2 nodes must share checkpoints"),
        ({}, "the engine Job must read model.onnx"),
        ({"nodes": 3}, "its 3 nodes must share checkpoints and the engine Job must read model.onnx"),
        ({"nodes": 2, "checkpoint": {"dir": "s3://bkt/c"}}, "the engine Job must read model.onnx"),
    ],
)
def test_validate_refuses_a_job_without_shared_storage_in_one_line(spec: dict, needs: str) -> None:
    result = validate_object(no_storage(**spec), "job.yaml")
    assert result.job is None
    assert result.errors == [f"spec.storage: the job has no shared storage but {needs}; {FIX}"]


@pytest.mark.parametrize(
    "spec",
    [
        {"engine": {"enabled": False}},
        {"nodes": 2, "storage": {"claimName": "shared"}},
        {"nodes": 2, "storage": {"url": "gs://bucket/jobs"}},
        {"nodes": 2, "checkpoint": {"dir": "s3://bkt/c"}, "artifacts": {"dir": "s3://bkt/a"}},
        {"nodes": 2, "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "mine"}}],
         "volumeMounts": [{"name": "v", "mountPath": "/workspace"}]},
    ],
    ids=["single-node-no-engine", "claim", "url", "object-dirs", "own-volume"],
)
def test_jobs_with_shared_storage_or_none_needed_pass(spec: dict) -> None:
    assert validate_object(no_storage(**spec)).errors == []


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        ({}, True), ({"nodes": 2, "engine": {"enabled": False}}, True), ({"engine": {"enabled": False}}, False),
        ({"nodes": 2, "storage": {"claimName": "c"}}, False), ({"storage": {"url": "s3://bkt/p"}}, False),
        ({"nodes": 2, "checkpoint": {"dir": "s3://bkt/c"}, "artifacts": {"dir": "gs://bkt/a"}}, False),
        ({"nodes": 2, "checkpoint": {"dir": "s3://bkt/c"}}, True),
    ],
)
def test_shared_storage_is_judged_after_the_job_defaults(admission: KubeAdmission, spec: dict, refused: bool) -> None:
    """The CRD cannot know the cluster's job defaults, which may hold the storage: it admits every case, and
    what dtrain validate (and the operator) refuse without defaults they take with defaults that name a claim."""
    assert admission.causes(no_storage(**spec)) == []
    assert (validate_object(no_storage(**spec)).job is None) == refused
    defaults = JobDefaults(spec={"storage": {"claimName": "dtrain-shared"}})
    assert validate_object(defaults.fill(no_storage(**spec))).errors == []


def test_dtrain_run_takes_the_quickstart_that_a_cluster_refuses() -> None:
    """`dtrain run`'s nodes share this machine's disk: the rule is about clusters."""
    quickstart = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
    job, errors = load_job(quickstart)
    assert errors == [] and job is not None
    cluster = validate_text(quickstart.read_text(), "quickstart.yaml")
    needs = "its 2 nodes must share checkpoints and the engine Job must read model.onnx"
    assert cluster.errors == [f"spec.storage: the job has no shared storage but {needs}; {FIX}"]
    validate = subprocess.run([sys.executable, "-m", "dtrain_operator.cli", "validate", str(quickstart)],
                              capture_output=True, text=True, check=False)
    assert validate.returncode == EXIT_INVALID_JOB
    assert validate.stderr.strip().splitlines() == [f"{quickstart}: {cluster.errors[0]}"]


def test_the_quickstart_validates_against_a_clusters_job_defaults(tmp_path: Path) -> None:
    """The chart's jobDefaults give the unchanged quick start its storage: `dtrain validate --defaults` says so."""
    quickstart = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
    defaults = tmp_path / "job-defaults.yaml"
    defaults.write_text("namespaces:\n  default:\n    storage: {claimName: dtrain-shared}\n")
    validate = subprocess.run([sys.executable, "-m", "dtrain_operator.cli", "validate", "--defaults", str(defaults),
                               str(quickstart)], capture_output=True, text=True, check=False)
    assert validate.returncode == 0, validate.stderr
    defaults.write_text("spec:\n  imag: registry.example.com/trainer:1\n")
    validate = subprocess.run([sys.executable, "-m", "dtrain_operator.cli", "validate", "--defaults", str(defaults),
                               str(quickstart)], capture_output=True, text=True, check=False)
    assert validate.returncode == EXIT_INVALID_JOB
    assert validate.stderr.startswith(f"dtrain validate: --defaults {defaults}: jobDefaults.spec.imag"), validate.stderr


# --- What the pods get --------------------------------------------------------------------------------


def test_credentials_reach_the_pods_only_as_secret_references() -> None:
    job = a_job("mnist").with_spec(storage={
        "url": "s3://bucket/jobs", "s3": {"endpoint": "http://minio.storage:9000", "region": "eu-west-1"},
        "credentialsSecret": "s3-creds",
    }).as_model()
    pod, engine = render.render_worker_pod(job, 0), engine_job.render_engine_job(job)
    for container in (pod["spec"]["containers"][0], engine["spec"]["template"]["spec"]["containers"][0]):
        env = {var["name"]: var for var in container["env"]}
        assert env["AWS_ENDPOINT_URL_S3"]["value"] == "http://minio.storage:9000"
        assert env["AWS_REGION"]["value"] == "eu-west-1"
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {
                "name": "s3-creds", "key": key, "optional": key == "AWS_SESSION_TOKEN"}}}
    config = render.trainer_files(job)["config.yaml"]
    assert "s3-creds" not in config and "AWS_" not in config
    assert "dir: s3://bucket/jobs/default/mnist/checkpoints" in config
    assert engine_job.engine_command(job)[2:4] == ["--onnx", "s3://bucket/jobs/default/mnist/artifacts/model.onnx"]


def test_without_a_secret_the_pods_use_their_service_account() -> None:
    job = a_job("mnist").with_spec(storage={"url": "gs://bucket/jobs"}).as_model()
    container = render.render_worker_pod(job, 0)["spec"]["containers"][0]
    assert not any(var["name"].startswith(("AWS_", "GOOGLE_")) for var in container["env"])


def test_a_gcs_key_is_mounted_from_the_secret() -> None:
    job = a_job("mnist").with_spec(storage={"url": "gs://bucket/jobs", "credentialsSecret": "gcs-key"}).as_model()
    pod = render.render_worker_pod(job, 0)
    env = {var["name"]: var.get("value") for var in pod["spec"]["containers"][0]["env"]}
    assert env["GOOGLE_APPLICATION_CREDENTIALS"] == "/var/run/secrets/dtrain/gcs/service-account.json"
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "dtrain-gcs-credentials")
    assert volume["secret"]["secretName"] == "gcs-key"


def test_a_job_without_storage_writes_to_a_pod_local_empty_dir() -> None:
    job = a_job("mnist").without_storage().with_spec(engine={"enabled": False}).as_model()
    pod = render.render_worker_pod(job, 0)
    assert {"name": "dtrain-storage", "emptyDir": {}} in pod["spec"]["volumes"]
    assert {"name": "dtrain-storage", "mountPath": "/workspace"} in pod["spec"]["containers"][0]["volumeMounts"]
    assert job_dirs.is_pod_local(job.spec, job.namespace, job.name)


# --- Credentials in URLs never reach a message -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCY@bucket/ckpt", "wJalrXUtnFEMI/K7MDENG/bPxRfiCY"),
        ("cannot reach https://minio:s3cr3t-pass@minio.storage:9000/bucket (timeout)", "s3cr3t-pass"),
        ("gs://svc:ya29.a0AfH6SMBx@bucket/p", "ya29.a0AfH6SMBx"),
    ],
)
def test_redaction_removes_credentials_embedded_in_urls(text: str, secret: str) -> None:
    from dtrain_operator.api.redaction import redact_text

    redacted = redact_text(text)
    assert secret not in redacted and "AKIAIOSFODNN7EXAMPLE" not in redacted
    assert "***@" in redacted


def test_an_sdk_error_is_described_without_its_credentials() -> None:
    from dtrain_common.object_store import describe

    error = ConnectionError("Could not connect to http://AKIAIOSFODNN7EXAMPLE:abc/def+ghi@127.0.0.1:1/bucket")
    assert "abc/def" not in describe(error) and describe(error).startswith("ConnectionError: ")


# --- The README's cluster walkthrough -----------------------------------------------------------------


def walkthrough_lines() -> list[str]:
    """The shell lines of README's "On a cluster" that make my-job.yaml, commented alternatives uncommented."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## On a cluster", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in section.split("```")[1::2] if "my-job.yaml" in b)
    lines, joined = [], ""
    for line in block.splitlines():
        joined += line.rstrip("\\").lstrip("# ") if line.startswith("#   ") else line.rstrip("\\")
        if not line.endswith("\\"):
            lines.append(joined)
            joined = ""
    return [line for line in lines if ">> my-job.yaml" in line or "> my-job.yaml" in line]


@pytest.mark.parametrize("choice", ["claimName", "url"])
def test_the_readme_walkthrough_makes_a_job_that_validate_takes(tmp_path: Path, choice: str) -> None:
    make, *storage_lines = walkthrough_lines()
    storage_line = next(line for line in storage_lines if choice in line)
    env = {"PATH": "/usr/bin:/bin", "REGISTRY": "registry.example.com/ml"}
    shutil.copytree(Path(__file__).resolve().parents[2] / "examples", tmp_path / "examples")  # run from a checkout
    subprocess.run(["bash", "-c", make], cwd=tmp_path, env=env, check=True)
    validate = [sys.executable, "-m", "dtrain_operator.cli", "validate", "my-job.yaml"]
    refused = subprocess.run(validate, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert refused.returncode == EXIT_INVALID_JOB and FIX in refused.stderr  # as written without storage: the one-line fix
    subprocess.run(["bash", "-c", storage_line], cwd=tmp_path, env=env, check=True)
    accepted = subprocess.run(validate, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert accepted.returncode == 0, accepted.stderr


# --- The operator ---------------------------------------------------------------------------------------


def test_the_operator_refuses_a_job_without_shared_storage_with_the_same_line() -> None:
    from dtrain_operator.api import DistributedTrainingStatus
    from dtrain_operator.core.accepted import parse_job

    parsed = parse_job(a_job("mnist").without_storage().with_nodes(2).as_dict(), DistributedTrainingStatus(), {})
    needs = "its 2 nodes must share checkpoints and the engine Job must read model.onnx"
    assert parsed.job is None and parsed.errors == (f"spec.storage: the job has no shared storage but {needs}; {FIX}",)


def test_a_pod_local_job_gets_the_warning_condition_and_one_event_at_creation() -> None:
    from dtrain_operator.core.observation import Observed
    from dtrain_operator.core.status.compute import compute_status
    from dtrain_operator.core.status.conditions import POD_LOCAL_STORAGE
    from dtrain_operator.core.status.events import status_events
    from tests.builders import NOW

    job = a_job("solo").with_uid().at_generation(1).without_storage().without_engine().as_model()
    first = compute_status(job, Observed(), None, NOW)
    condition = next(c for c in first.conditions if c.type == POD_LOCAL_STORAGE)
    assert (condition.status, condition.reason) == ("True", "CheckpointsDieWithThePod")
    assert "do not outlive the pod" in condition.message and FIX in condition.message
    assert [e.reason for e in status_events(None, first) if e.type == "Warning"] == [POD_LOCAL_STORAGE]
    shared = a_job("shared").with_uid().at_generation(1).without_engine().as_model()
    assert not [c for c in compute_status(shared, Observed(), None, NOW).conditions if c.type == POD_LOCAL_STORAGE]


# --- A checkpoint that could not be written ---------------------------------------------------------------


def test_a_missed_checkpoint_is_said_beside_the_newest_written_one_and_cleared_by_the_next() -> None:
    from dtrain_operator.api.records import status_patch

    saved = {"event": "checkpoint", "time": "t1", "step": 20, "path": "s3://b/c/step=00000020.ckpt", "ok": True,
             "bytes": 100, "uploadSeconds": 1.5, "attempts": 1}
    missed = {"event": "checkpoint", "time": "t2", "step": 30, "path": "s3://b/c/step=00000030.ckpt", "ok": False,
              "error": "EndpointConnectionError: Could not connect", "attempts": 5}
    assert status_patch(saved) == {"lastCheckpoint": {"step": 20, "path": saved["path"], "time": "t1", "missed": None}}
    assert status_patch(missed) == {"lastCheckpoint": {"missed": {
        "step": 30, "path": missed["path"], "error": missed["error"], "time": "t2"}}}


def test_a_missed_checkpoint_gets_the_warning_condition_until_one_is_written() -> None:
    from dtrain_operator.api import CheckpointInfo
    from dtrain_operator.core.observation import Observed
    from dtrain_operator.core.status.compute import compute_status
    from dtrain_operator.core.status.events import status_events
    from dtrain_operator.core.status.storage_conditions import CONDITION
    from tests.builders import NOW, a_gang, accepted_status

    job = a_job("mnist").with_uid().with_nodes(2).without_engine()
    running = accepted_status(job.as_model())
    missed = {"step": 30, "path": "s3://b/c/step=00000030.ckpt", "error": "EndpointConnectionError: x", "time": "t2"}
    running.last_checkpoint = CheckpointInfo.model_validate(
        {"step": 20, "path": "s3://b/c/step=00000020.ckpt", "missed": missed})
    model = job.as_model().model_copy(update={"status": running})
    status = compute_status(model, Observed(workers=a_gang("Running", "Running")), running, NOW)
    condition = next(c for c in status.conditions if c.type == CONDITION)
    assert condition.status == "True"
    assert "step 30 could not be written to s3://b/c/step=00000030.ckpt (EndpointConnectionError: x)" in condition.message
    assert "the newest written is step 20" in condition.message
    assert [e.reason for e in status_events(running, status) if e.type == "Warning"] == [CONDITION]

    written = status.model_copy(update={"last_checkpoint": CheckpointInfo(step=40, path="s3://b/c/step=00000040.ckpt")})
    later = compute_status(job.as_model().model_copy(update={"status": written}),
                           Observed(workers=a_gang("Running", "Running")), written, NOW)
    assert next(c for c in later.conditions if c.type == CONDITION).status == "False"
