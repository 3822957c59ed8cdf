"""Issue 42: what a careless user writes in spec.volumes, spec.volumeMounts and spec.storage beside what the operator
adds to the pods, paths the storage rules would misjudge, annotation keys the API server lower-cases, sizes in
bytes, initArgs the built-in classes do not take, and image digests the kubelet cannot check: each refused by
`dtrain validate` with the field and the fix."""

from __future__ import annotations

import pytest
import yaml

from dtrain_operator.api import DistributedTraining, contract
from dtrain_operator.api.record_room import KUBECTL_LAST_APPLIED, MAX_SPEC_AND_ANNOTATIONS_BYTES, spec_bytes
from dtrain_operator.api.validation import validate_object
from dtrain_operator.core import engine_job, render
from tests.unit.test_job_files import errors_of, job_text

DATA = "  volumes:\n    - name: data\n      persistentVolumeClaim: {claimName: imagenet}\n"
CLAIM = "  storage: {claimName: shared}\n"

# --- Collisions with what the operator adds -------------------------------------------------------------

# (what is wrong, spec YAML, the start of the one line it gets)
COLLISIONS = [
    ("mount at the claim's own mountPath", DATA + "  storage: {claimName: shared, mountPath: /data}\n"
     "  volumeMounts:\n    - {name: data, mountPath: /data//}\n",
     ("spec.volumeMounts[0].mountPath: '/data//' is where dtrain mounts the job's storage (spec.storage.mountPath); "
      "mount elsewhere")),
    ("volume named as the gs:// credentials", "  volumes:\n    - name: dtrain-gcs-credentials\n      emptyDir: {}\n",
     "spec.volumes[0].name: 'dtrain-gcs-credentials' is the name of a volume the operator adds"),
    ("volume named as the token", "  volumes:\n    - name: dtrain-operator-token\n      emptyDir: {}\n",
     "spec.volumes[0].name: 'dtrain-operator-token' is the name of a volume the operator adds"),
    ("mount inside the gs:// credentials", DATA + "  volumeMounts:\n    - {name: data, mountPath: /var/run/secrets/dtrain/gcs/x}\n",
     "spec.volumeMounts[0].mountPath: '/var/run/secrets/dtrain/gcs/x' would cover /var/run/secrets/dtrain/gcs"),
    ("mount at the config, spelt oddly", DATA + "  volumeMounts:\n    - {name: data, mountPath: /etc//dtrain/.}\n",
     "spec.volumeMounts[0].mountPath: '/etc//dtrain/.' would cover /etc/dtrain, where the operator mounts the trainer's config"),
    ("storage mounted over the config", "  storage: {claimName: shared, mountPath: /etc/dtrain}\n",
     ("spec.storage.mountPath: '/etc/dtrain' would cover /etc/dtrain, where dtrain mounts the trainer's config; "
      "mount the claim elsewhere")),
    ("storage mounted inside the token's directory", "  storage: {claimName: shared, mountPath: /var/run/secrets/dtrain.dev/operator/x}\n",
     "spec.storage.mountPath: '/var/run/secrets/dtrain.dev/operator/x' would cover /var/run/secrets/dtrain.dev/operator"),
    ("storage mounted over shared memory", "  storage: {claimName: shared, mountPath: /dev/shm}\n",
     "spec.storage.mountPath: '/dev/shm' would cover /dev/shm"),
    ("storage with only a mountPath", "  storage: {mountPath: /data}\n",
     "spec.storage.mountPath: is where the claim of claimName is mounted, and no claim is named"),
    ("storage url with a mountPath", "  storage: {url: s3://bucket/jobs, mountPath: /data}\n",
     "spec.storage.mountPath: is where the claim of claimName is mounted"),
    ("mount of a storage volume object storage has not", "  volumeMounts:\n    - {name: dtrain-storage, mountPath: /data}\n",
     "spec.volumeMounts[0].name: 'dtrain-storage' names no volume of spec.volumes"),
    ("two mounts at one path, spelt differently", DATA + "  volumeMounts:\n    - {name: data, mountPath: /data}\n"
     "    - {name: data, mountPath: /x/../data}\n",
     "spec.volumeMounts[1].mountPath: '/x/../data' is already the mountPath of spec.volumeMounts[0]; give each mount"),
]


@pytest.mark.parametrize("case,spec,expected", COLLISIONS, ids=[case[0] for case in COLLISIONS])
def test_a_collision_with_the_operators_volumes_is_refused_in_one_line(case, spec, expected):
    lines = errors_of(job_text(spec))
    assert len(lines) == 1 and lines[0].startswith(expected), lines


ACCEPTED = [
    # Object storage mounts nothing at /workspace: the place is free.
    ("a mount at /workspace beside object storage", DATA + "  volumeMounts:\n    - {name: data, mountPath: /workspace}\n"),
    ("the claim at its default mountPath, written out", "  storage: {claimName: shared, mountPath: /workspace}\n"),
    ("a mount beside the operator's directories", DATA + "  volumeMounts:\n    - {name: data, mountPath: /etc/dtrain-data}\n"),
]


@pytest.mark.parametrize("case,spec", ACCEPTED, ids=[case[0] for case in ACCEPTED])
def test_what_leaves_the_operators_volumes_alone_is_accepted(case, spec):
    assert errors_of(job_text(spec)) == []


def _mount_paths(pod_spec: dict) -> list[str]:
    return [mount["mountPath"] for mount in pod_spec["containers"][0]["volumeMounts"]]


def test_a_volume_of_the_jobs_own_at_workspace_takes_the_place_of_the_pod_local_one():
    """Without a claim, the operator's emptyDir at /workspace makes way: two mounts there and no pod is created."""
    text = job_text("  storage: {}\n  nodes: 2\n" + DATA + "  volumeMounts:\n    - {name: data, mountPath: /workspace/}\n")
    result = validate_object(yaml.safe_load(text))
    assert result.errors == [] and result.job is not None
    worker = render.render_worker_pod(result.job, 0)["spec"]
    engine = engine_job.render_engine_job(result.job)["spec"]["template"]["spec"]
    for pod_spec in (worker, engine):
        assert "/workspace" not in _mount_paths(pod_spec) and _mount_paths(pod_spec).count("/workspace/") == 1
        assert contract.STORAGE_VOLUME not in [volume["name"] for volume in pod_spec["volumes"]]


# --- Paths judged as the trainer will use them -----------------------------------------------------------

PATHS = [
    ("checkpoints leaving the claim", CLAIM + "  checkpoint: {dir: /workspace/../tmp/x}\n",
     "spec.checkpoint.dir: holds a '..' component, which leaves the directory it names; write the directory itself"),
    ("artifacts leaving their prefix", "  artifacts: {dir: s3://bucket/a/../b}\n", "spec.artifacts.dir: holds a '..' component"),
    ("a claim mounted through '..'", "  storage: {claimName: shared, mountPath: /mnt/../workspace}\n",
     "spec.storage.mountPath: holds a '..' component"),
    ("a claim name no claim can have", "  storage: {claimName: ../../etc}\n",
     "spec.storage.claimName: must be a DNS-1123 subdomain"),
    ("a Secret name no Secret can have", "  storage: {url: s3://bucket/jobs, credentialsSecret: Team_Keys}\n",
     "spec.storage.credentialsSecret: must be a DNS-1123 subdomain"),
]


@pytest.mark.parametrize("case,spec,expected", PATHS, ids=[case[0] for case in PATHS])
def test_a_path_or_name_that_is_not_what_it_reads_as_is_refused(case, spec, expected):
    lines = errors_of(job_text(spec))
    assert len(lines) == 1 and lines[0].startswith(expected), lines


@pytest.mark.parametrize("directory", ["//workspace/ckpt", "/workspace/./ckpt", "/workspace//ckpt/"])
def test_a_directory_on_the_claim_is_shared_however_it_is_spelt(directory):
    assert errors_of(job_text(CLAIM + f"  nodes: 2\n  checkpoint: {{dir: '{directory}'}}\n")) == []


# --- Sizes in bytes, with room for the operator's record -----------------------------------------------------


def _with_env_values(count: int, value: str) -> str:
    return "  env:\n" + "".join(f"    - {{name: VAR_{i}, value: '{value}'}}\n" for i in range(count))


def test_annotations_are_counted_in_bytes_as_the_api_server_counts_them():
    """70,000 characters of four bytes each: 280,000 bytes, over the API server's 262,144."""
    lines = errors_of(job_text(metadata="  annotations: {note: '" + "\U0001f642" * 70_000 + "'}\n"))
    assert len(lines) == 1 and lines[0].startswith("metadata.annotations: hold 280,004 bytes;"), lines


def test_a_spec_over_its_bytes_is_refused_with_the_size_the_limit_and_what_to_shrink():
    """30 values of 1,000 emoji: 30,000 characters, 120,000 bytes."""
    lines = errors_of(job_text(_with_env_values(30, "\U0001f642" * 1000)))
    assert len(lines) == 1 and lines[0].startswith("spec: is 12"), lines
    assert f"over the {MAX_SPEC_AND_ANNOTATIONS_BYTES:,} a job's spec may be" in lines[0]
    assert "shrink what is largest (initArgs, env, volumes)" in lines[0]


def test_annotations_that_leave_no_room_for_kubectls_copy_are_refused():
    lines = errors_of(job_text(metadata="  annotations: {note: '" + "x" * 120_000 + "'}\n"))
    assert len(lines) == 1 and lines[0].startswith("metadata.annotations: hold 120,004 bytes; beside this spec ("), lines
    assert "keep room for `kubectl apply`'s copy of them and of the spec" in lines[0]


def test_kubectls_copy_is_not_counted_as_the_users():
    """A stored job carries it; it is what the room is kept for."""
    document = yaml.safe_load(job_text(metadata="  annotations: {note: small}\n"))
    document["metadata"]["annotations"].update({KUBECTL_LAST_APPLIED: "k" * 100_000})
    assert validate_object(document).errors == []


def test_the_spec_is_measured_as_utf8_json():
    job = DistributedTraining.model_validate(yaml.safe_load(job_text(_with_env_values(1, "\u00e9" * 100))))
    plain = DistributedTraining.model_validate(yaml.safe_load(job_text(_with_env_values(1, "e" * 100))))
    assert spec_bytes(job.spec) - spec_bytes(plain.spec) == 100


# --- The built-in classes' arguments ---------------------------------------------------------------------------

INIT_ARGS = [
    ("an argument the synthetic data does not take",
     "  data: {classPath: dtrain_trainer.data.SyntheticImageDataModule, initArgs: {no_such_argument: 1}}\n",
     ("spec.data.initArgs.no_such_argument: SyntheticImageDataModule takes no argument 'no_such_argument'; it takes: "
      "image_size, channels, num_classes, num_samples, pool_size, seed, pin_memory")),
    ("a misspelt argument of the model by its bare name",
     "  model: {classPath: ImageClassifier, initArgs: {archh: resnet18}}\n",
     "spec.model.initArgs.archh: ImageClassifier takes no argument 'archh'; did you mean 'arch'?"),
    ("the digits with an argument of the synthetic data",
     "  data: {classPath: dtrain_trainer.digits.DigitsDataModule, initArgs: {num_samples: 64}}\n",
     "spec.data.initArgs.num_samples: DigitsDataModule takes no argument 'num_samples'"),
    ("an image folder without its directory", "  data: {classPath: ImageFolderDataModule, initArgs: {val_dir: /data}}\n",
     "spec.data.initArgs: ImageFolderDataModule needs 'train_dir'"),
    ("the batch size in a user's data module", "  data: {classPath: mypkg.Data, initArgs: {batch_size: 8}}\n",
     "spec.data.initArgs.batch_size: set trainer.batchSize instead; the trainer passes it to the class"),
]


@pytest.mark.parametrize("case,spec,expected", INIT_ARGS, ids=[case[0] for case in INIT_ARGS])
def test_init_args_a_class_would_refuse_in_the_pod_are_refused(case, spec, expected):
    lines = errors_of(job_text(spec))
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_a_users_class_takes_any_init_args():
    spec = "  model: {classPath: mypkg.Model, initArgs: {anything: 1}}\n  data: {classPath: mypkg.Data, initArgs: {x: 2}}\n"
    assert errors_of(job_text(spec)) == []


# --- Image digests the kubelet can check -------------------------------------------------------------------

DIGESTS = [
    ("localhost/trainer@sha256:" + "3f" * 20, False),
    ("localhost/trainer:1@sha256:" + "AB" * 32, False),
    ("localhost/trainer@md5:" + "0" * 32, False),
    ("localhost/trainer:1@sha256:" + "ab" * 32, True),
    ("localhost/trainer@sha512:" + "0" * 128, True),
]


@pytest.mark.parametrize("image,pulls", DIGESTS, ids=[image.split("@")[1][:12] for image, _ in DIGESTS])
def test_an_image_digest_is_one_the_kubelet_can_check(image, pulls):
    lines = errors_of(job_text(f"  image: {image}\n"))
    if pulls:
        assert lines == []
    else:
        assert len(lines) == 1 and lines[0].startswith("spec.image: has a digest the kubelet refuses (InvalidImageName)"), lines
