"""The three images, built for real (`make images`), each run from its own root filesystem as its
own non-root user with its real entrypoint (tools/run-in-rootfs.sh; no container runtime needed):

- the operator image serves a job against the test API server, with a read-only root filesystem
  as the chart runs it, and has no torch;
- the trainer image trains one node of the quick start to completion and imports both
  pytorch_lightning and lightning;
- the engine image's `dtrain build-engine` says that TensorRT (or a GPU) is missing, then checks
  the trained model with ONNX Runtime (--fallback onnxruntime).

`.ci/images` builds the images and runs these with DTRAIN_IMAGES naming a JSON file of
{name: {rootfs, user, entrypoint, env, workdir}}; without it they are skipped (`make test`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dtrain_operator import api
from dtrain_operator.api import contract, job_dirs
from dtrain_operator.core import render

ROOT = Path(__file__).resolve().parents[2]
RUN_IN_ROOTFS = ROOT / "tools" / "run-in-rootfs.sh"
IMAGES_FILE = os.environ.get("DTRAIN_IMAGES")

pytestmark = pytest.mark.skipif(not IMAGES_FILE, reason="no built images (DTRAIN_IMAGES): run .ci/images")


def image(name: str) -> dict[str, Any]:
    images = json.loads(Path(IMAGES_FILE or "").read_text())
    return images[name]


def in_image(name: str, command: list[str] | None = None, *, read_only: bool = False,
             binds: dict[Path, str] | None = None, env: dict[str, str] | None = None) -> list[str]:
    """The command line that runs `command` (default: the image's entrypoint) in the image."""
    info = image(name)
    argv = [str(RUN_IN_ROOTFS)]
    if read_only:
        argv.append("--read-only")
    for host, guest in (binds or {}).items():
        argv += ["--bind", f"{host}:{guest}"]
    for key, value in {**info["env"], **(env or {})}.items():
        argv += ["--env", f"{key}={value}"]
    argv += ["--workdir", info.get("workdir") or "/", info["rootfs"], info["user"], "--"]
    return argv + (command if command is not None else info["entrypoint"])


def run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize("name,uid", [("operator", 65532), ("trainer", 10001), ("engine", 10001)])
def test_each_image_runs_as_its_own_non_root_user(name, uid):
    assert int(image(name)["user"].split(":")[0]) == uid
    done = run(in_image(name, ["id", "-u"]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(uid)


def test_the_trainer_images_dtrain_command_works_and_says_what_it_lacks():
    validated = run(in_image("trainer", ["dtrain", "crd"], read_only=True))
    assert validated.returncode == 0 and "kind: CustomResourceDefinition" in validated.stdout, validated.stderr
    missing = run(in_image("trainer", ["dtrain", "operator"], read_only=True))
    assert missing.returncode == 127 and "not in this image" in missing.stderr and "Traceback" not in missing.stderr


# --- The operator image --------------------------------------------------------------------------


def test_the_operator_image_has_no_torch():
    probe = "import importlib.util as u, dtrain_operator.controller.main; print(u.find_spec('torch'), u.find_spec('lightning'))"
    done = run(in_image("operator", ["python", "-c", probe], read_only=True))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None None"


async def test_the_operator_image_serves_a_job(tmp_path: Path):
    from tests.builders import a_cpu_job
    from tests.operator.cluster import running_cluster
    from tests.operator.operator_process import OPERATOR_NAMESPACE, OperatorProcess

    class ImageOperator(OperatorProcess):
        """`dtrain operator` as the image's entrypoint, root filesystem read-only, /tmp its only
        writable place (as the chart's Deployment), the kubeconfig bind-mounted."""

        def start(self) -> None:
            args = [f"--health-port={self.health_port}", f"--metrics-port={self.metrics_port}", "--all-namespaces",
                    "--watch-timeout=20", "--log-level=DEBUG"]
            argv = in_image("operator", image("operator")["entrypoint"] + args, read_only=True,
                            binds={self.kubeconfig.parent: "/kube"},
                            env={"KUBECONFIG": f"/kube/{self.kubeconfig.name}", "POD_ID": "dtrain-operator-image",
                                     # as the chart's Deployment: jobs in its own namespace are refused
                                     "POD_NAMESPACE": OPERATOR_NAMESPACE})
            log = self.log.open("ab")
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            log.close()

    async with running_cluster(tmp_path) as cluster:
        tmp_path.chmod(0o755)  # the image's user reads the kubeconfig through the bind mount
        cluster.kubeconfig.chmod(0o644)
        process = ImageOperator(cluster.kubeconfig, tmp_path / "operator.log")
        cluster.operators.append(process)
        process.start()
        await cluster.eventually(
            lambda: cluster.api.count_calls(("kopf/", "dtrain-operator/"), verb="watch", resource="pods") > 0
            or (not process.running and (_ for _ in ()).throw(AssertionError(process.log_tail()))),
            "the operator in its image watching pods", timeout=90,
        )
        await cluster.apply(a_cpu_job("imaged").with_nodes(2).as_dict())
        await cluster.run_all("default", "imaged", 2)
        await cluster.phase("default", "imaged", "Running")
        for rank in (0, 1):
            await cluster.exit("default", f"imaged-{rank}", 0)
        await cluster.phase("default", "imaged", "Succeeded")
        assert "Read-only file system" not in process.log_tail(400)


# --- The trainer and engine images -------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One node of the quick start (nodes: 1), trained by the trainer image's entrypoint with the
    environment and config the operator renders for worker 0; /workspace is the shared volume."""
    work = tmp_path_factory.mktemp("trainer")
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["nodes"] = 1
    doc["spec"]["trainer"]["maxEpochs"] = 1  # CI time: the quick start's model and data, one epoch
    job = api.DistributedTraining.model_validate(doc)
    assert job_dirs.artifacts_dir(job.spec, "default", job.metadata.name) == str(ARTIFACTS)
    config_dir = work / "etc-dtrain"
    config_dir.mkdir()
    for key, text in render.trainer_files(job).items():
        (config_dir / key).write_text(text)
    workspace = work / "workspace"
    workspace.mkdir(mode=0o777)
    os.chmod(workspace, 0o777)
    container = render.render_worker_pod(job, 0, 0)["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.update({
        contract.ENV_MASTER_ADDR: "127.0.0.1",
        contract.ENV_JOB_NAMESPACE: "default",
        contract.ENV_PROGRESS_SINK: contract.PROGRESS_SINK_STDOUT,
        contract.ENV_TERMINATION_LOG: "/workspace/termination-log",
        "OMP_NUM_THREADS": "1",
    })
    argv = in_image("trainer", container["command"] + container.get("args", []),
                    binds={config_dir: contract.CONFIG_MOUNT_DIR, workspace: "/workspace"}, env=env)
    done = run(argv, timeout=900)
    (work / "trainer.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return workspace


# The quick start's directories in /workspace: per job, under the namespace and the name (api.storage).
JOB_DIR = Path("default", "quickstart")
ARTIFACTS = Path("/workspace", JOB_DIR, "artifacts")


def test_the_trainer_image_trains_one_node_of_the_quick_start(trained: Path):
    artifacts = trained / JOB_DIR / "artifacts"
    assert (artifacts / contract.ONNX_FILE_NAME).stat().st_size > 0
    assert json.loads((artifacts / contract.ARTIFACTS_FILE_NAME).read_text())
    assert (trained / JOB_DIR / "checkpoints" / "last.ckpt").exists()
    assert json.loads((trained / "termination-log").read_text())


def test_the_trainer_image_has_both_lightning_packages():
    probe = "import pytorch_lightning, lightning, torch; print(pytorch_lightning.__version__, lightning.__version__)"
    done = run(in_image("trainer", ["python", "-c", probe]))
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 2


def test_the_engine_image_says_tensorrt_is_missing_then_falls_back_to_onnx_runtime(trained: Path):
    engine = ["dtrain", "build-engine", "--onnx", str(ARTIFACTS / contract.ONNX_FILE_NAME),
              "--out", "/workspace/engine/model.plan", "--precision", "fp32", "--min-batch", "1",
              "--opt-batch", "8", "--max-batch", "32"]
    binds = {trained: "/workspace"}
    refused = run(in_image("engine", engine, binds=binds, env={"OMP_NUM_THREADS": "1"}))
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "TensorRT is not installed" in refused.stderr or "no CUDA GPU" in refused.stderr, refused.stderr
    assert "--fallback onnxruntime" in refused.stderr
    fallback = run(in_image("engine", engine + ["--fallback", "onnxruntime"], binds=binds, env={"OMP_NUM_THREADS": "1"}))
    assert fallback.returncode == 0, (fallback.stdout + fallback.stderr)[-4000:]
    report = json.loads((trained / "engine" / "engine-report.json").read_text())
    assert "onnxruntime" in json.dumps(report).lower()
