"""`dtrain validate` refuses what the cluster would refuse, accepts what it would accept, and answers
any file with a short, clean, escaped answer: tables of small job files, each with the line it gets.

Issue 29, items 2 and 3: values PyYAML raises on, files of thousands of unknown keys, special files,
keys that forge lines, nulls the API server drops, Kubernetes fields passed through to pods, engine
profiles, credentials, and the operator's own annotations.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from dtrain_operator.api import contract
from dtrain_operator.api.safe_yaml import load_documents
from dtrain_operator.api.validation import EXIT_INVALID_JOB, validate_file, validate_object, validate_text
from dtrain_operator.cli import main as cli

HEAD = """\
apiVersion: dtrain.dev/v1alpha1
kind: DistributedTraining
metadata:
  name: job
spec:
  accelerator: cpu
  storage: {url: s3://dtrain-tests/jobs}
"""


def job_text(spec: str = "", metadata: str = "") -> str:
    """HEAD with `spec` (YAML at the spec's indentation) and `metadata` lines added; a `spec` that names its
    own storage replaces HEAD's."""
    text = HEAD.replace("  name: job\n", "  name: job\n" + metadata)
    if "\n  storage:" in "\n" + spec:
        text = text.replace("  storage: {url: s3://dtrain-tests/jobs}\n", "")
    return text + spec


def errors_of(text: str) -> list[str]:
    return validate_text(text, "job.yaml").errors


# --- Item 2: values as kubectl reads them ------------------------------------------------------------


@pytest.mark.parametrize("value", ["2024-02-30", "2024-13-01", "2024-01-01T10:00:00-25:00", "2024-01-01", "2001-12-14 21:59:43.10 -5"])
def test_an_implicit_timestamp_is_the_string_written(value):
    """kubectl (sigs.k8s.io/yaml) keeps timestamps as strings: an impossible date is no error, and no date is a datetime."""
    [document] = load_documents(f"a: {value}\n")
    assert document == {"a": value}


def test_a_date_in_a_string_field_is_accepted():
    assert errors_of(job_text("  logging:\n    mlflowExperimentName: 2024-02-30\n")) == []


# Every spelling YAML 1.1 (and so kubectl's go-yaml v2) reads as a boolean.
YAML11_TRUE = ["y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"]
YAML11_FALSE = ["n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"]


@pytest.mark.parametrize(("key", "meaning"), [(key, "true") for key in YAML11_TRUE] + [(key, "false") for key in YAML11_FALSE])
def test_an_unquoted_key_kubectl_reads_as_a_boolean_is_refused_as_written(key, meaning):
    """`initArgs: {n: 96}` reaches the class as the key "false" through kubectl: refused here, not in the pod."""
    result = validate_text(job_text(f"  data:\n    classPath: my.Data\n    initArgs:\n      {key}: 96\n"), "job.yaml")
    assert result.source == "job.yaml:11:7"
    assert result.errors == [(
        f"spec.data.initArgs: the key {key} (unquoted) is YAML 1.1's boolean {meaning} to kubectl, which sends it as "
        f'the key "{meaning}"; quote it: "{key}"'
    )]


def test_a_boolean_key_anywhere_is_named_by_its_path():
    text = job_text("  env: [{name: A, value: x}, {name: B, Off: 1}]\n")
    assert errors_of(text) == [(
        'spec.env[1]: the key Off (unquoted) is YAML 1.1\'s boolean false to kubectl, which sends it as the key "false"; '
        'quote it: "Off"'
    )]
    assert errors_of("on: 1\n")[0].startswith("(document): the key on (unquoted)")


@pytest.mark.parametrize("key", ['"n"', "'y'", '"yes"', "nn", "yes_no", "null_ok"])
def test_a_quoted_key_or_another_word_is_the_string_written(key):
    result = validate_text(job_text(f"  data:\n    classPath: my.Data\n    initArgs: {{{key}: 96}}\n"), "job.yaml")
    assert result.job is not None and result.job.spec.data.init_args == {key.strip("'\""): 96}


def test_the_operator_takes_the_key_kubectl_sent():
    """What the API server stores is JSON: the key "false" of `n: 96` is a key like any other there."""
    document = yaml.safe_load(job_text("  data:\n    classPath: my.Data\n    initArgs: {'false': 96}\n"))
    result = validate_object(document, "job")
    assert result.errors == [] and result.job is not None and result.job.spec.data.init_args == {"false": 96}


@pytest.mark.parametrize(("value", "expected"), [("y", True), ("N", False), ("yes", True), ("off", False), ('"y"', "y")])
def test_a_value_is_a_boolean_where_kubectl_reads_one(value, expected):
    [document] = load_documents(f"a: {value}\n")
    assert document == {"a": expected}


# --- Item 2: bounded output (its linear time: bench/validate_scale.py) ---------------------------------------------------------------


def test_thousands_of_unknown_keys_get_a_capped_answer(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(job_text("".join(f"  unknownField{i}: {i}\n" for i in range(12_000))))
    code = cli.main(["validate", str(path)])
    lines = capsys.readouterr().err.splitlines()
    assert code == EXIT_INVALID_JOB
    assert len(lines) == 11 and lines[-1] == f"{path}: ... and 11,990 more unknown fields"
    # The known fields are listed once, not on every line.
    assert sum("known fields:" in line for line in lines) == 1
    assert sum(len(line) for line in lines) < 3000


def test_errors_of_other_kinds_are_capped_too():
    lines = errors_of(job_text("  env:\n" + "".join(f"    - name: PET_{i}\n" for i in range(15))))
    assert len(lines) == 11 and lines[-1] == "... and 5 more errors"


# --- Item 2: special files ---------------------------------------------------------------------------------


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [sys.executable, "-m", "dtrain_operator.cli", "validate", str(fifo)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == EXIT_INVALID_JOB
    assert proc.stderr == f"{fifo}: not a regular file (a FIFO): give a job file\n"


@pytest.mark.parametrize("path,kind", [("/dev/zero", "a character device"), ("/dev/null", "a character device"), ("/", "a directory")])
def test_a_device_or_a_directory_is_refused_before_a_byte_is_read(path, kind):
    if not os.path.exists(path):
        pytest.skip(f"{path} does not exist here")
    assert validate_file(path).errors == [f"not a regular file ({kind}): give a job file"]


def test_a_file_over_the_api_servers_limit_is_refused(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(b"#" * (3 * 1024 * 1024 + 1))
    assert validate_file(path).errors == ["the file is over 3 MiB, the API server's request limit"]


# --- Item 2: what is echoed is escaped ------------------------------------------------------------------------


def test_a_key_cannot_forge_a_line(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(job_text('  "x\\n/tmp/job.yaml: ok: DistributedTraining job (1 node(s) x 1 cpu process(es))": 1\n'))
    assert cli.main(["validate", str(path)]) == EXIT_INVALID_JOB
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith(f'{path}: spec["x\\n/tmp/job.yaml: ok: ')


@pytest.mark.parametrize(
    "spec,expected",
    [
        # A terminal escape sequence in a key and in a value.
        ('  "\\e[31mred": 1\n', 'spec["\\x1b[31mred"]: unknown field'),
        ('  image: "\\e]0;title\\a"\n', "spec.image: "),
        # A bidi override and a line separator.
        ('  "a\\u202eb": 1\n', 'spec["a\\u202eb"]: unknown field'),
        ('  "a\\u2028b": 1\n', 'spec["a\\u2028b"]: unknown field'),
        # Keys shown as typed, quoted where they are not plain names.
        ("  nodes[0]: 2\n", 'spec["nodes[0]"]: unknown field'),
        ("  trainer.maxEpochs: 2\n", 'spec["trainer.maxEpochs"]: unknown field'),
        ('  scheduling:\n    nodeSelector: {"a b": c}\n', 'spec.scheduling.nodeSelector["a b"]: '),
    ],
)
def test_echoed_keys_and_values_are_escaped(spec, expected):
    [line] = errors_of(job_text(spec))
    assert line.startswith(expected), line
    assert line.isprintable(), line


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("  trainer:\n    limitTrainBatches: many\n", "spec.trainer.limitTrainBatches: "),
        ("  resources:\n    limits:\n      cpu: [1]\n", "spec.resources.limits.cpu: "),
        ("  nccl:\n    env:\n      bad key: x\n", 'spec.nccl.env["bad key"]: '),
    ],
)
def test_paths_never_show_pydantics_own_names(spec, expected):
    lines = errors_of(job_text(spec))
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert not any(word in lines[0] for word in ("constrained-", "[key]", "function-", "'int'", ".str:")), lines[0]


# --- Item 3: a file is refused where the cluster refuses it -----------------------------------------------------


def test_a_file_without_spec_is_refused_as_the_crd_requires_it():
    assert errors_of(HEAD.split("spec:")[0]) == ["spec: required field is missing"]
    assert errors_of(HEAD.split("spec:")[0] + "spec:\n") == ["spec: required field is missing"]


@pytest.mark.parametrize(
    "spec",
    [
        "  trainer:\n    # batchSize: 64\n",
        "  env:\n",
        "  model:\n    classPath: dtrain_trainer.models.ImageClassifier\n    initArgs: null\n",
        "  scheduling:\n    nodeSelector:\n    tolerations:\n",
        "  resources:\n    limits:\n      # cpu: 4\n",
        "  env:\n    - name: A\n      value: null\n",
        "  runPolicy:\n    activeDeadlineSeconds: ~\n",
    ],
)
def test_a_section_left_null_is_absent_as_the_api_server_reads_it(spec):
    assert errors_of(job_text(spec)) == []


def test_nulls_inside_init_args_are_kept():
    result = validate_text(job_text("  model:\n    classPath: a.B\n    initArgs:\n      weights: null\n"), "job.yaml")
    assert result.job is not None and result.job.spec.model.init_args == {"weights": None}


VOLUME = "  volumes:\n    - name: data\n      persistentVolumeClaim: {claimName: imagenet}\n"

# (what is wrong, spec YAML, the start of the one line it gets)
REFUSED = [
    ("env value with valueFrom", "  env:\n    - name: A\n      value: x\n      valueFrom: {fieldRef: {fieldPath: metadata.name}}\n", "spec.env[0].valueFrom: may not be set when value is not empty"),
    ("volume without name", "  volumes:\n    - emptyDir: {}\n", "spec.volumes[0].name: required field is missing"),
    ("volume of the operator's", "  volumes:\n    - name: dshm\n      emptyDir: {}\n", "spec.volumes[0].name: 'dshm' is the name of a volume the operator adds"),
    ("two volumes of one name", VOLUME + "    - name: data\n      emptyDir: {}\n", "spec.volumes[1].name: 'data' names two volumes"),
    ("mount of no volume", VOLUME + "  volumeMounts:\n    - name: dat\n      mountPath: /data\n", "spec.volumeMounts[0].name: 'dat' names no volume of spec.volumes"),
    ("mount of the config volume", VOLUME + "  volumeMounts:\n    - name: dtrain-config\n      mountPath: /data\n", "spec.volumeMounts[0].name: 'dtrain-config' names no volume"),
    ("mount without a path", VOLUME + "  volumeMounts:\n    - name: data\n", "spec.volumeMounts[0].mountPath: required field is missing"),
    ("mount over shared memory", VOLUME + "  volumeMounts:\n    - name: data\n      mountPath: /dev/shm/\n", "spec.volumeMounts[0].mountPath: '/dev/shm/' would cover /dev/shm"),
    ("mount inside the config", VOLUME + "  volumeMounts:\n    - name: data\n      mountPath: /etc/dtrain/extra\n", "spec.volumeMounts[0].mountPath: '/etc/dtrain/extra' would cover /etc/dtrain"),
    ("mount at the storage path", VOLUME + "  storage: {claimName: shared}\n  volumeMounts:\n    - name: data\n      mountPath: /workspace\n", "spec.volumeMounts[0].mountPath: '/workspace' is where dtrain mounts the job's storage (spec.storage.mountPath); mount elsewhere"),
    ("two mounts at one path", VOLUME + "  volumeMounts:\n    - {name: data, mountPath: /data}\n    - {name: data, mountPath: /data/}\n", "spec.volumeMounts[1].mountPath: '/data/' is already the mountPath of spec.volumeMounts[0]"),
    ("toleration not an object", "  scheduling:\n    tolerations: [gpu]\n", "spec.scheduling.tolerations[0]: Input should be a valid dictionary"),
    ("profiles naming other inputs", "  engine:\n    profiles:\n      - inputs: {x: {min: [1], opt: [2], max: [4]}}\n      - inputs: {z: {min: [1], opt: [2], max: [4]}}\n", "spec.engine.profiles[1].inputs: names ['z'], profile 0 ['x']"),
    ("profiles of other ranks", "  engine:\n    profiles:\n      - inputs: {x: {min: [1], opt: [2], max: [4]}}\n      - inputs: {x: {min: [1, 1], opt: [2, 2], max: [4, 4]}}\n", "spec.engine.profiles[1].inputs.x: has rank 2, 1 in profile 0"),
    ("profile min above max", "  engine:\n    profiles:\n      - inputs: {x: {min: [8, 3], opt: [4, 3], max: [2, 3]}}\n", "spec.engine.profiles[0].inputs.x: needs min <= opt <= max on every axis"),
    ("profile input name with a comma", "  engine:\n    profiles:\n      - inputs: {'a,b': {min: [1], opt: [1], max: [1]}}\n", 'spec.engine.profiles[0].inputs["a,b"]: '),
]


@pytest.mark.parametrize("case,spec,expected", REFUSED, ids=[case[0] for case in REFUSED])
def test_what_a_pod_could_never_have_is_refused_in_one_line(case, spec, expected):
    lines = errors_of(job_text(spec))
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_what_only_the_api_server_judges_is_named_on_the_ok_line(tmp_path, capsys):
    """Offline, a toleration the server refuses (tests/unit/test_wrong_jobs_on_the_server.py) passes as written."""
    path = tmp_path / "job.yaml"
    path.write_text(job_text("  scheduling:\n    tolerations: [{key: gpu, operator: Is}]\n"))
    assert cli.main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(
        "; spec.scheduling.tolerations go to the pods as written: --server has the API server judge them")


ACCEPTED = [
    ("env from the pod", "  env:\n    - name: A\n      value: ''\n      valueFrom: {fieldRef: {fieldPath: \"metadata.labels['app.kubernetes.io/name']\"}}\n"),
    ("env from a secret", "  env:\n    - name: HF_TOKEN\n      valueFrom: {secretKeyRef: {name: hf, key: token, optional: true}}\n"),
    ("env from a resource", "  env:\n    - name: MEM\n      valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}\n"),
    ("volumes and mounts", VOLUME + "    - name: scratch\n      emptyDir: {medium: Memory, sizeLimit: 1Gi}\n  volumeMounts:\n    - {name: data, mountPath: /data, readOnly: true}\n    - {name: scratch, mountPath: /scratch, subPath: run}\n"),
    ("a mount of the storage volume", "  storage: {claimName: shared}\n  volumeMounts:\n    - {name: dtrain-storage, mountPath: /data, subPath: datasets}\n"),
    ("a mount inside the storage path", VOLUME + "  storage: {claimName: shared}\n  volumeMounts:\n    - {name: data, mountPath: /workspace/data}\n"),
    ("tolerations", "  scheduling:\n    tolerations:\n      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n      - {operator: Exists}\n      - {key: spot, value: 'true', effect: NoExecute, tolerationSeconds: 60}\n"),
    ("affinity", "  scheduling:\n    affinity:\n      nodeAffinity:\n        requiredDuringSchedulingIgnoredDuringExecution:\n          nodeSelectorTerms: [{matchExpressions: [{key: nvidia.com/gpu.product, operator: In, values: [A100]}]}]\n      podAntiAffinity:\n        preferredDuringSchedulingIgnoredDuringExecution:\n          - weight: 100\n            podAffinityTerm: {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {dtrain.dev/role: worker}}}\n"),
    ("names", "  serviceAccountName: trainer.team-a\n  scheduling:\n    schedulerName: volcano\n    priorityClassName: high-priority\n    nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, pool: ''}\n"),
    ("images", "  image: registry.example:5000/team/trainer:1.0@sha256:" + "a" * 64 + "\n  engine:\n    image: localhost/engine\n"),
    ("quantities", "  resources:\n    requests: {cpu: 500m, memory: 1.5Gi, ephemeral-storage: 1e9}\n    limits: {cpu: 2, memory: 2Gi, example.com/fpga: 1, hugepages-2Mi: 1Gi}\n"),
    ("profiles", "  engine:\n    profiles:\n      - inputs: {'input:0': {min: [1, 3], opt: [4, 3], max: [8, 3]}, mask: {min: [1], opt: [1], max: [1]}}\n      - inputs: {'input:0': {min: [8, 3], opt: [8, 3], max: [16, 3]}, mask: {min: [1], opt: [1], max: [1]}}\n"),
]


@pytest.mark.parametrize("case,spec", ACCEPTED, ids=[case[0] for case in ACCEPTED])
def test_what_the_api_server_takes_is_accepted(case, spec):
    assert errors_of(job_text(spec)) == []


def test_metadata_the_api_server_takes_is_accepted():
    metadata = (
        "  namespace: team-a\n  labels: {app.kubernetes.io/name: dtrain, team: ''}\n"
        f"  annotations: {{{contract.ANNOTATION_MEMORY_ESTIMATE}: '{{}}', Example.com/Note: any text}}\n"
    )
    assert errors_of(job_text(metadata=metadata)) == []


# --- Item 3: credentials ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("  logging:\n    logger: mlflow\n    mlflowTrackingUri: https://alice:hunter2hunter2@mlflow.example\n",
         "spec.logging.mlflowTrackingUri: holds a credential"),
        ("  model:\n    classPath: a.B\n    initArgs: {headers: {Authorization: Bearer abcdefghijklmnop}}\n",
         "spec.model.initArgs: headers.Authorization looks like a credential"),
        ("  data:\n    classPath: a.B\n    initArgs: {url: 'https://bob:hunter2hunter2@data.example/x'}\n",
         "spec.data.initArgs: url looks like a credential"),
    ],
)
def test_a_credential_is_refused_with_the_way_to_pass_it_and_never_echoed(spec, expected):
    [line] = errors_of(job_text(spec))
    assert line.startswith(expected), line
    assert "secretKeyRef" in line
    assert "hunter2" not in line and "abcdefghijklmnop" not in line


def test_an_echoed_value_is_redacted():
    [line] = errors_of(job_text("  image: https://alice:hunter2hunter2@registry.example/x\n"))
    assert line.startswith("spec.image: ") and "hunter2" not in line and "alice:***@" in line


# --- Item 3: one exit code for an invalid file ---------------------------------------------------------------------


def test_validate_exits_as_submit_and_run_do_for_an_invalid_file(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(job_text() + "---\n" + job_text())
    for command in (["validate"], ["run", "--no-engine"]):
        proc = subprocess.run(
            [sys.executable, "-m", "dtrain_operator.cli", *command, str(path)],
            capture_output=True, text=True, timeout=120, check=False,
        )
        assert proc.returncode == EXIT_INVALID_JOB == 2, proc.stderr
        assert proc.stderr == f"{path}: holds 2 YAML documents; give one DistributedTraining per file\n"
