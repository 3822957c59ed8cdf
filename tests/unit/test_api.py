"""The API model, the CRD generated from it, and `dtrain validate`.

The bad-spec table is the contract with users: each bad input is rejected with a
line that names the field, so that a typo never becomes a silent default.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from dtrain_operator import api
from dtrain_operator.api import contract, crd
from dtrain_operator.api.validation import EXIT_INVALID_JOB, validate_object, validate_text
from dtrain_operator.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def base_job() -> dict:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": "job"},
        "spec": {"nodes": 2, "accelerator": "cpu", "storage": {"claimName": "workspace"}},
    }


def with_spec(path: str, value) -> dict:
    """A base job with `value` set at the dotted spec path (list indices as digits)."""
    job = base_job()
    node = job["spec"]
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return job


# Examples for `dtrain run` (no spec.storage): a cluster refuses them until storage is added (tests/unit/test_storage.py).
LOCAL_EXAMPLES = {"quickstart.yaml", "lit-model.yaml"}


def example_objects() -> list[tuple[str, dict]]:
    return [(p.name, doc) for p in EXAMPLES for doc in yaml.safe_load_all(p.read_text()) if doc]


def test_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"quickstart.yaml", "resnet50-imagenet.yaml", "no-engine.yaml", "team-package.yaml"} <= names


@pytest.mark.parametrize("name,obj", example_objects(), ids=lambda v: v if isinstance(v, str) else "")
def test_example_validates_with_model(name, obj):
    result = validate_object(obj, name, cluster=name not in LOCAL_EXAMPLES)
    assert result.errors == []


@pytest.mark.parametrize("name,obj", example_objects(), ids=lambda v: v if isinstance(v, str) else "")
def test_example_validates_against_crd_schema(name, obj):
    """The CRD and the model agree: the example as written, and with every default filled in."""
    schema = crd.openapi_schema()
    jsonschema.Draft4Validator(schema).validate(obj)
    filled = api.DistributedTraining.model_validate(obj).to_wire()
    jsonschema.Draft4Validator(schema).validate(filled)


def test_the_no_engine_example_is_the_quickstart_with_its_checked_export_and_no_engine_job():
    quickstart, no_engine = (yaml.safe_load((ROOT / "examples" / name).read_text())["spec"]
                             for name in ("quickstart.yaml", "no-engine.yaml"))
    assert [no_engine[part] for part in ("model", "data", "trainer")] == [quickstart[part] for part in
                                                                          ("model", "data", "trainer")]
    job = api.DistributedTraining.model_validate(yaml.safe_load((ROOT / "examples" / "no-engine.yaml").read_text()))
    assert not job.spec.engine.enabled and job.spec.export.onnx.enabled


def test_seed_example_carries_the_seed_settings():
    job = api.DistributedTraining.model_validate(yaml.safe_load((ROOT / "examples/resnet50-imagenet.yaml").read_text()))
    spec = job.spec
    assert (spec.nodes, spec.devices_per_node) == (4, 8)
    assert spec.trainer.precision == "16-mixed" and spec.trainer.gradient_clip_val == 0.5
    assert spec.trainer.max_epochs == 50 and spec.trainer.accumulate_grad_batches > 1
    assert spec.nccl.to_env()["NCCL_IB_DISABLE"] == "1" and spec.nccl.to_env()["NCCL_SOCKET_IFNAME"] == "eth0"
    assert spec.engine.precision == "fp16" and spec.engine.max_batch == 32
    assert spec.model.init_args["arch"] == "resnet50"


def test_defaults_are_the_builtins():
    job = api.DistributedTraining.model_validate({**base_job(), "spec": {}})
    assert job.spec.model.class_path == api.BUILTIN_MODEL
    assert job.spec.data.class_path == api.BUILTIN_SYNTHETIC_DATA
    assert job.spec.engine.max_batch == 32
    assert job.spec.engine.resolved_opt_batch == 32
    assert job.spec.master_port == contract.DEFAULT_MASTER_PORT


# (what is wrong, the object, a text every error line must show: the field path)
BAD_SPECS = [
    ("zero nodes", with_spec("nodes", 0), "spec.nodes"),
    ("negative devices", with_spec("devicesPerNode", -1), "spec.devicesPerNode"),
    ("unknown precision", with_spec("trainer.precision", "fp8-magic"), "spec.trainer.precision"),
    ("nccl env without prefix", with_spec("nccl.env", {"IB_HCA": "mlx5"}), "spec.nccl.env"),
    ("min batch above max", with_spec("engine", {"minBatch": 64, "maxBatch": 32}), "spec.engine"),
    ("opt batch above max", with_spec("engine", {"optBatch": 64, "maxBatch": 32}), "spec.engine"),
    ("typo in a field", with_spec("trainer.maxEpoch", 3), "spec.trainer.maxEpoch"),
    ("typo at the top of spec", with_spec("node", 3), "spec.node"),
    ("string for an int", with_spec("nodes", "four"), "spec.nodes"),
    ("reserved env name", with_spec("env", [{"name": "PET_NODE_RANK", "value": "3"}]), "spec.env[0].name"),
    ("reserved torch env name", with_spec("env", [{"name": "WORLD_SIZE", "value": "3"}]), "spec.env[0].name"),
    ("NCCL var in env", with_spec("env", [{"name": "NCCL_DEBUG", "value": "INFO"}]), "spec.env[0].name"),
    ("unknown accelerator", with_spec("accelerator", "tpu"), "spec.accelerator"),
    ("unknown restart policy", with_spec("runPolicy.restartPolicy", "Always"), "spec.runPolicy.restartPolicy"),
    ("negative backoff", with_spec("runPolicy.backoffLimit", -1), "spec.runPolicy.backoffLimit"),
    ("unknown clean pod policy", with_spec("runPolicy.cleanPodPolicy", "Some"), "spec.runPolicy.cleanPodPolicy"),
    ("failure rule pattern RE2 cannot compile",
     with_spec("runPolicy.failureRules", [{"action": "FailJob", "onExitCodes": [1]}, {"action": "RestartGang"},
                                          {"action": "FailJob", "onTerminationMessage": "NCCL (error"}]),
     "spec.runPolicy.failureRules[2].onTerminationMessage"),
    ("failure rule pattern with a look-ahead",
     with_spec("runPolicy.failureRules", [{"action": "RestartGang", "onTerminationMessage": "CUDA(?= error)"}]),
     "spec.runPolicy.failureRules[0].onTerminationMessage"),
    ("failure rule pattern too long",
     with_spec("runPolicy.failureRules", [{"action": "RestartGang", "onTerminationMessage": "a" * 513}]),
     "spec.runPolicy.failureRules[0].onTerminationMessage"),
    ("failure rule exit code above 255",
     with_spec("runPolicy.failureRules", [{"action": "FailJob", "onExitCodes": [3, 300]}]),
     "spec.runPolicy.failureRules[0].onExitCodes[1]"),
    ("failure rule exit code range reversed",
     with_spec("runPolicy.failureRules", [{"action": "FailJob", "onExitCodes": ["140-130"]}]),
     "spec.runPolicy.failureRules[0].onExitCodes[0]"),
    ("failure rule exit codes not a range",
     with_spec("runPolicy.failureRules", [{"action": "FailJob", "onExitCodes": ["1-2-3"]}]),
     "spec.runPolicy.failureRules[0].onExitCodes[0]"),
    ("failure rule unknown action", with_spec("runPolicy.failureRules", [{"action": "Retry"}]),
     "spec.runPolicy.failureRules[0].action"),
    ("failure rule reason not a reason",
     with_spec("runPolicy.failureRules", [{"action": "FailJob", "onReasons": ["out of memory"]}]),
     "spec.runPolicy.failureRules[0].onReasons[0]"),
    ("gang minAvailable above nodes", with_spec("scheduling", {"schedulerName": "volcano", "gang": {"enabled": True, "minAvailable": 5}}), "spec"),
    ("gang without scheduler", with_spec("scheduling.gang", {"enabled": True}), "spec.scheduling"),
    ("gang volcano without scheduler", with_spec("scheduling.gang", {"enabled": True, "provider": "volcano"}), "spec.scheduling"),
    ("unknown gang provider", with_spec("scheduling.gang", {"enabled": True, "provider": "kueue"}), "spec.scheduling.gang.provider"),
    ("topology on a label that is no label", with_spec("scheduling.topology", {"required": "rack name"}),
     "spec.scheduling.topology.required"),
    ("unknown nccl debug level", with_spec("nccl.debug", "LOUD"), "spec.nccl.debug"),
    ("nccl var twice", with_spec("nccl", {"ibDisable": True, "env": {"NCCL_IB_DISABLE": "0"}}), "spec.nccl"),
    ("opset too old", with_spec("export.onnx.opset", 11), "spec.export.onnx.opset"),
    ("engine precision", with_spec("engine.precision", "fp8"), "spec.engine.precision"),
    ("engine without onnx", with_spec("export.onnx.enabled", False), "spec"),
    ("bad quantity", with_spec("resources", {"limits": {"memory": "lots"}}), "spec.resources.limits"),
    ("quantity with a newline", with_spec("resources", {"limits": {"memory": "16Gi\n"}}), "spec.resources.limits"),
    ("fractional number for a quantity", with_spec("resources", {"requests": {"cpu": 0.5}}), "spec.resources.requests"),
    ("scheduler name not a DNS name", with_spec("scheduling.schedulerName", "My Scheduler"), "spec.scheduling.schedulerName"),
    ("priority class not a DNS name", with_spec("scheduling.priorityClassName", "high_prio"), "spec.scheduling.priorityClassName"),
    ("service account not a DNS name", with_spec("serviceAccountName", "Trainer"), "spec.serviceAccountName"),
    ("node selector key not a label key", with_spec("scheduling.nodeSelector", {"gpu type": "a100"}), "spec.scheduling.nodeSelector"),
    ("node selector value not a label value", with_spec("scheduling.nodeSelector", {"gpu": "a 100"}), "spec.scheduling.nodeSelector"),
    ("image with a space", with_spec("image", "my registry/trainer:1"), "spec.image"),
    ("image in capitals", with_spec("image", "Registry.example/Trainer:1"), "spec.image"),
    ("engine image with a newline", with_spec("engine.image", "trainer:1\n"), "spec.engine.image"),
    ("profile min above max", with_spec("engine.profiles", [{"inputs": {"x": {"min": [8], "opt": [4], "max": [2]}}}]), "spec.engine.profiles[0].inputs.x"),
    ("profile ranks differ", with_spec("engine.profiles", [{"inputs": {"x": {"min": [1], "opt": [1, 3], "max": [1, 3]}}}]), "spec.engine.profiles[0].inputs.x"),
    ("profile input name with a comma", with_spec("engine.profiles", [{"inputs": {"a,b": {"min": [1], "opt": [1], "max": [1]}}}]), "spec.engine.profiles[0].inputs"),
    ("progress deadline between two reports", with_spec("runPolicy.progressDeadlineSeconds", 10), "spec.runPolicy.progressDeadlineSeconds"),
    ("layer precision pattern with a comma", with_spec("engine.layerPrecisions", {"fc1,fc2": "fp16"}), 'spec.engine.layerPrecisions["fc1,fc2"]'),
    ("relative checkpoint dir", with_spec("checkpoint.dir", "ckpts"), "spec.checkpoint.dir"),
    ("checkpoint dir leaving its directory", with_spec("checkpoint.dir", "/workspace/../tmp/x"), "spec.checkpoint.dir"),
    ("claim name not a DNS name", with_spec("storage", {"claimName": "../../etc"}), "spec.storage.claimName"),
    ("storage mountPath without a claim", with_spec("storage", {"url": "s3://bucket/jobs", "mountPath": "/data"}),
     "spec.storage.mountPath"),
    ("zero checkpoint interval", with_spec("checkpoint.everyNSteps", 0), "spec.checkpoint.everyNSteps"),
    ("limitTrainBatches above one as fraction", with_spec("trainer.limitTrainBatches", 1.5), "spec.trainer.limitTrainBatches"),
    ("negative clip", with_spec("trainer.gradientClipVal", -0.5), "spec.trainer.gradientClipVal"),
    ("bad class path", with_spec("model", {"classPath": "my model"}), "spec.model.classPath"),
    ("model without class path", with_spec("model", {"initArgs": {}}), "spec.model.classPath"),
    ("port out of range", with_spec("masterPort", 80), "spec.masterPort"),
    ("image pull policy", with_spec("imagePullPolicy", "Sometimes"), "spec.imagePullPolicy"),
    ("bool for a list", with_spec("volumes", True), "spec.volumes"),
    ("name too long", {**base_job(), "metadata": {"name": "x" * 50}}, "metadata.name"),
    ("name with capitals", {**base_job(), "metadata": {"name": "MyJob"}}, "metadata.name"),
    ("no metadata", {k: v for k, v in base_job().items() if k != "metadata"}, "metadata"),
    ("wrong apiVersion", {**base_job(), "apiVersion": "dtrain.dev/v1"}, "apiVersion"),
    ("wrong kind", {**base_job(), "kind": "PyTorchJob"}, "kind"),
]


@pytest.mark.parametrize("case,obj,field", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_is_rejected_naming_the_field(case, obj, field):
    result = validate_object(obj, "job.yaml")
    assert result.job is None
    assert result.errors, case
    assert any(line.startswith(field) for line in result.errors), result.errors


def test_wire_names_are_the_documented_ones():
    """camelCase as a person writes it, where the automatic conversion would not (p2p -> p2P)."""
    job = api.DistributedTraining.model_validate(with_spec("nccl", {"p2pDisable": True}))
    assert job.spec.nccl.to_env()["NCCL_P2P_DISABLE"] == "1"
    assert "p2pDisable" in crd.openapi_schema()["properties"]["spec"]["properties"]["nccl"]["properties"]
    assert "workspaceMiB" in crd.openapi_schema()["properties"]["spec"]["properties"]["engine"]["properties"]


def test_typo_gets_a_suggestion():
    [line] = validate_object(with_spec("trainer.maxEpoch", 3)).errors
    assert "did you mean 'maxEpochs'" in line


def test_enum_error_lists_what_is_allowed():
    [line] = validate_object(with_spec("trainer.precision", "fp8-magic")).errors
    assert "'fp8-magic'" in line and "'bf16-mixed'" in line


def test_reserved_env_says_why():
    [line] = validate_object(with_spec("env", [{"name": "PET_NODE_RANK", "value": "3"}])).errors
    assert "reserved" in line and "operator sets it" in line


@pytest.mark.parametrize(
    "text,expected",
    [
        ("spec: [unclosed", "YAML syntax error"),
        ("", "no YAML document"),
        ("# only a comment\n", "no YAML document"),
        ("- a list\n", "expected a mapping"),
    ],
)
def test_unparseable_documents(text, expected):
    result = validate_text(text, "bad.yaml")
    assert any(expected in e for e in result.errors), result.errors


def test_a_file_of_several_jobs_is_refused_as_submit_and_run_refuse_it():
    good = yaml.safe_dump(base_job())
    result = validate_text(good + "---\n" + good, "two.yaml")
    assert (result.source, result.job, result.errors) == (
        "two.yaml", None, ["holds 2 YAML documents; give one DistributedTraining per file"]
    )


def test_cli_validate_exit_codes(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(base_job()))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_spec("nodes", 0)))
    assert cli.main(["validate", str(good)]) == 0
    assert cli.main(["validate", str(good), str(bad)]) == EXIT_INVALID_JOB == 2
    err = capsys.readouterr().err
    assert "bad.yaml: spec.nodes:" in err
    assert cli.main(["validate", str(tmp_path / "missing.yaml")]) == EXIT_INVALID_JOB
    assert "cannot read the file" in capsys.readouterr().err


def test_cli_validate_never_prints_a_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: dtrain.dev/v1alpha1\nkind: DistributedTraining\nmetadata: {name: a}\nspec: {nodes: [1]}\n\t:")
    proc = subprocess.run(
        [sys.executable, "-m", "dtrain_operator.cli", "validate", str(bad)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == EXIT_INVALID_JOB
    assert "Traceback" not in proc.stderr and "YAML syntax error" in proc.stderr


# --- The CRD --------------------------------------------------------------------------


def test_crd_shape():
    doc = crd.crd()
    assert doc["metadata"]["name"] == "distributedtrainings.dtrain.dev"
    names = doc["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("DistributedTraining", "distributedtrainings", ["dtr"])
    [version] = doc["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Phase", "Nodes", "Epoch", "Img/s", "Val", "Restarts", "Goodput", "Age"]
    schema = version["schema"]["openAPIV3Schema"]
    assert schema["properties"]["status"]["x-kubernetes-preserve-unknown-fields"] is True


def _walk(schema: dict, path: str = ""):
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _walk(schema[key], f"{path}[{key}]")


def test_crd_schema_is_structural_and_documented():
    """Every property has a type (or int-or-string / preserve-unknown) and a description;
    no $ref, no nullable unions, no additionalProperties: false (all rejected by the API server)."""
    for path, node in _walk(crd.openapi_schema()["properties"]["spec"], "spec"):
        assert "$ref" not in node and "anyOf" not in node or node.get("x-kubernetes-int-or-string"), path
        assert node.get("additionalProperties") is not False, path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        if not path.endswith("]"):
            assert node.get("description"), f"{path} has no description (kubectl explain)"


def test_the_crd_stores_no_defaults():
    """A field a job leaves unset stays unset in the stored object, so that the cluster's job defaults can fill it
    (api.job_defaults); the API reference still shows each default."""
    stored = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert [path for path, node in _walk(stored, "spec") if "default" in node] == ["spec.runPolicy"]
    assert crd.openapi_schema()["properties"]["spec"]["properties"]["image"]["default"] == contract.DEFAULT_TRAINER_IMAGE


def test_crd_carries_constraints_and_cel_rules():
    spec = crd.openapi_schema()["properties"]["spec"]
    assert spec["properties"]["nodes"]["minimum"] == 1
    assert "bf16-mixed" in spec["properties"]["trainer"]["properties"]["precision"]["enum"]
    engine_rules = [r["rule"] for r in spec["properties"]["engine"]["x-kubernetes-validations"]]
    assert any("(has(self.minBatch) ? self.minBatch : 1) <= (has(self.maxBatch) ? self.maxBatch : 32)" in r
               for r in engine_rules)
    spec_rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("self.nodes == oldSelf.nodes" in r for r in spec_rules), "nodes is immutable"
    # runPolicy is not compared whole (suspend and ttlSecondsAfterFinished may change); the scheduling
    # rule only reads whether the stored job is suspended.
    assert not any("self.runPolicy == oldSelf.runPolicy" in r for r in spec_rules), "runPolicy may change in part"
    run_policy_rules = [r["rule"] for r in spec["properties"]["runPolicy"]["x-kubernetes-validations"]]
    assert not any("suspend" in r or "ttlSecondsAfterFinished" in r for r in run_policy_rules)
    assert any("backoffLimit" in r for r in run_policy_rules)
    nccl_env_rules = [r["rule"] for r in spec["properties"]["nccl"]["properties"]["env"]["x-kubernetes-validations"]]
    assert nccl_env_rules == [f"self.all(k, k.matches('{contract.NCCL_ENV_PATTERN}'))"]


def test_crd_rejects_what_the_model_rejects_where_openapi_can_say_it():
    schema = crd.openapi_schema()
    for obj in (with_spec("nodes", 0), with_spec("trainer.precision", "fp8-magic"), with_spec("trainer.batchSize", "big")):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft4Validator(schema).validate(obj)


def test_committed_crd_is_the_generated_one():
    committed = ROOT / "manifests" / "crd.yaml"
    assert committed.read_text() == crd.crd_yaml(), "run `make manifests` to regenerate manifests/crd.yaml"


def test_immutable_spec_ignores_only_the_mutable_fields():
    spec = api.DistributedTrainingSpec()
    changed = copy.deepcopy(spec)
    changed.run_policy.suspend = True
    changed.run_policy.ttl_seconds_after_finished = 60
    assert api.immutable_spec(spec) == api.immutable_spec(changed)
    changed.run_policy.backoff_limit = 9
    assert api.immutable_spec(spec) != api.immutable_spec(changed)


@pytest.mark.parametrize(
    "trainer,epochs",
    [({}, 1), ({"maxSteps": 100}, -1), ({"maxEpochs": 3, "maxSteps": 100}, 3), ({"maxEpochs": 5}, 5)],
)
def test_max_steps_alone_sets_no_epoch_limit(trainer, epochs):
    """A job that says only maxSteps trains for that many steps, not for one epoch."""
    assert api.TrainerSettings.model_validate(trainer).resolved_max_epochs == epochs


def test_every_name_the_package_exports_resolves_from_its_module() -> None:
    """The re-exports are lazy: each of `__all__` is read from the module the package's imports name."""
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'NotAName'"):
        api.NotAName  # noqa: B018


def test_the_supervisor_starts_without_the_models() -> None:
    """A pod's supervisor runs before torchrun on every start: it loads the launch orders, not the job's models
    (nor torch)."""
    probe = (
        "import sys, dtrain_trainer.supervisor; "
        "print(sorted(m for m in ('dtrain_operator.api.spec', 'dtrain_operator.api.status', 'torch') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
