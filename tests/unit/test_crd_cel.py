"""The CRD as kube-apiserver sees it: its CEL rules compiled and run by a real CEL engine, their
worst-case cost within the API server's budgets, every integer bounded; the rules in step with
the pydantic validators that say the same thing: test_crd_cel_parity.py. How the cost is estimated,
and where the formula and the limits come from: tests/celrules.py."""

from __future__ import annotations

import copy

import pytest

from dtrain_operator import api
from dtrain_operator.api import crd
from tests import celrules
from tests.crd_admission import CrdAdmission, cel_causes
from tests.unit.test_api import BAD_SPECS, LOCAL_EXAMPLES, base_job, example_objects, with_spec

SCHEMA = crd.openapi_schema()
RULES = list(celrules.rules(SCHEMA))
ADMISSION = CrdAdmission(crd.crd())


def rule_id(rule: celrules.Rule) -> str:
    return f"{rule.path}: {rule.rule[:60]}"


def cel_messages(obj: dict, old: dict | None = None) -> list[str]:
    """What the CEL rules alone say about an object (after the API server's defaulting)."""
    new = copy.deepcopy(obj)
    ADMISSION.structural.default(new)
    return [str(c) for c in cel_causes(celrules.with_object_meta(SCHEMA), new, old)]


def test_the_crd_has_rules():
    assert len(RULES) >= 20 and any(r.transition for r in RULES)


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_every_rule_compiles(rule):
    celrules.compile_rule(rule.rule)


def test_rules_use_only_standard_cel_functions():
    """A Kubernetes CEL library function (quantity(), url(), ...) must be implemented and named in
    celrules.KUBERNETES_FUNCTIONS before a rule may use it; today none is."""
    used = set().union(*(celrules.functions(celrules.checked_ast(r.rule)) for r in RULES))
    assert used <= celrules.STANDARD_FUNCTIONS | set(celrules.KUBERNETES_FUNCTIONS), used


# --- Cost -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_rule_cost_is_within_the_per_rule_budget(rule):
    cost = celrules.total_cost(rule)
    assert cost <= celrules.STATIC_ESTIMATED_COST_LIMIT, (
        f"{rule.path}: estimated rule cost {cost} exceeds budget by factor of "
        f"{cost / celrules.STATIC_ESTIMATED_COST_LIMIT:.1f}x (add maxLength/maxItems/maxProperties)"
    )


def test_crd_cost_is_within_the_per_crd_budget():
    total = sum(celrules.total_cost(r) for r in RULES)
    assert total <= celrules.STATIC_ESTIMATED_CRD_COST_LIMIT, total


def test_the_estimate_refuses_what_an_api_server_refuses():
    """The env rules on a name without maxLength, in a list of 256: the API server's 'estimated rule
    cost exceeds budget' (a regex over a 3 MiB string, 256 times), as the CRD was before the bounds."""
    unbounded = copy.deepcopy(SCHEMA)
    del unbounded["properties"]["spec"]["properties"]["env"]["items"]["properties"]["name"]["maxLength"]
    env_rules = [r for r in celrules.rules(unbounded) if r.path == "spec.env[*]"]
    over = [r for r in env_rules if celrules.total_cost(r) > celrules.STATIC_ESTIMATED_COST_LIMIT]
    assert [r.rule for r in over] == ["!self.name.matches('^(NCCL|TORCH_NCCL)_')"]
    # cel-go's numbers for the regex rule: ceil(0.1 x (3 MiB - 2 + 1)) x ceil(0.25 x 19) per item.
    regex_rule = next(r for r in env_rules if "matches" in r.rule)
    assert celrules.estimated_cost(regex_rule) == 3 + 314573 * 5
    del unbounded["properties"]["spec"]["properties"]["env"]["maxItems"]
    [unbounded_list] = [r for r in celrules.rules(unbounded) if r.path == "spec.env[*]" and "matches" in r.rule]
    assert unbounded_list.cardinality is None and celrules.max_cardinality(unbounded_list) > 256


def _walk(schema: dict, path: str = "spec"):
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _walk(schema[key], f"{path}[*]")


def test_every_string_list_and_map_of_the_spec_is_bounded():
    for path, node in _walk(SCHEMA["properties"]["spec"]):
        if node.get("x-kubernetes-preserve-unknown-fields") and "properties" not in node:
            continue  # free-form Kubernetes objects: rules only compare them whole (at no cost of their size)
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, path
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if isinstance(node.get("additionalProperties"), dict):
            assert "maxProperties" in node, path


def test_every_integer_has_a_maximum():
    for path, node in _walk(SCHEMA["properties"]["spec"]):
        if node.get("type") in ("integer", "number"):
            assert "maximum" in node, f"{path} has no maximum"


@pytest.mark.parametrize(
    "path,value",
    [
        ("scheduling.gang.scheduleTimeoutSeconds", 10**14),
        ("runPolicy.activeDeadlineSeconds", 3 * 10**11),
        ("runPolicy.ttlSecondsAfterFinished", 10**15),
        ("nccl.timeoutSeconds", 10**12),
        ("trainer.seed", 2**40),
    ],
)
def test_integers_that_overflowed_a_reconcile_are_refused(path, value):
    """Values that passed validation and then crashed every reconcile with OverflowError."""
    from dtrain_operator.api.validation import validate_object

    obj = with_spec(path, value)
    assert validate_object(obj).errors, path
    with pytest.raises(Exception, match="less than or equal to"):
        ADMISSION.check(obj)


# --- The rules, run -------------------------------------------------------------------------------

# The bad specs of tests/unit/test_api.py that a CEL rule exists for, and the rule's message.
CEL_REJECTS = {
    "nccl env without prefix": "spec.nccl.env: Invalid value: \"object\": every key must match",
    "min batch above max": "spec.engine: Invalid value: \"object\": need minBatch <= optBatch <= maxBatch",
    "opt batch above max": "spec.engine: Invalid value: \"object\": need minBatch <= optBatch <= maxBatch",
    "reserved env name": "spec.env[0]: Invalid value: \"object\": this name is reserved",
    "reserved torch env name": "spec.env[0]: Invalid value: \"object\": this name is reserved",
    "NCCL var in env": "spec.env[0]: Invalid value: \"object\": NCCL variables go under spec.nccl",
    "gang minAvailable above nodes": "spec: Invalid value: \"object\": scheduling.gang.minAvailable cannot exceed nodes",
    "gang without scheduler": "spec.scheduling: Invalid value: \"object\": gang.enabled needs gang.provider: kubernetes",
    "gang volcano without scheduler": "spec.scheduling: Invalid value: \"object\": gang.enabled needs gang.provider: kubernetes",
    "engine without onnx": "spec: Invalid value: \"object\": engine.enabled needs export.onnx.enabled",
    "limitTrainBatches above one as fraction": "spec.trainer: Invalid value: \"object\": limitTrainBatches is a number",
    "name too long": "<nil>: Invalid value: \"object\": metadata.name must be a DNS-1035 label",
    "node selector key not a label key": "spec.scheduling.nodeSelector: Invalid value: \"object\": every key must match",
    "profile min above max": "spec.engine.profiles[0].inputs[x]: Invalid value: \"object\": min, opt and max need the same rank",
    "profile ranks differ": "spec.engine.profiles[0].inputs[x]: Invalid value: \"object\": min, opt and max need the same rank",
    "profile input name with a comma": "spec.engine.profiles[0].inputs: Invalid value: \"object\": every key must match",
    "progress deadline between two reports": "spec.runPolicy.progressDeadlineSeconds: Invalid value: \"integer\": 0 (off) or at least 30",
    "layer precision pattern with a comma": "spec.engine.layerPrecisions: Invalid value: \"object\": every key must match",
    "name with capitals": "<nil>: Invalid value: \"object\": metadata.name must be a DNS-1035 label",
    "checkpoint dir leaving its directory": "spec.checkpoint.dir: Invalid value: \"string\": holds a '..' component",
    "storage mountPath without a claim": "spec.storage: Invalid value: \"object\": mountPath is where the claim",
    # CEL has no "is a regex": matching '' compiles the pattern, and RE2's error refuses the object.
    "failure rule pattern RE2 cannot compile": "spec.runPolicy.failureRules[2].onTerminationMessage: Invalid value: "
    "\"string\": INVALID_ARGUMENT: invalid regular expression: missing ): NCCL (error evaluating rule: "
    "onTerminationMessage must be an RE2 regular expression",
    "failure rule pattern with a look-ahead": "spec.runPolicy.failureRules[0].onTerminationMessage: Invalid value: "
    "\"string\": INVALID_ARGUMENT: invalid regular expression: invalid perl operator: (?=",
}
# Bad specs that only the model catches (the operator reports them in the Failed condition):
# no rule of the CRD says "not both ibDisable and env.NCCL_IB_DISABLE", nor compares the two codes of a
# range (CEL reads no number out of a string without Kubernetes' string library).
MODEL_ONLY = {"nccl var twice", "failure rule exit code range reversed"}
BAD = {case: obj for case, obj, _ in BAD_SPECS}


@pytest.mark.parametrize("case", sorted(CEL_REJECTS))
def test_a_bad_spec_is_rejected_by_its_rule_with_the_rules_message(case):
    messages = cel_messages(BAD[case])
    assert any(m.startswith(CEL_REJECTS[case]) for m in messages), messages


@pytest.mark.parametrize("case", sorted(set(BAD) - set(CEL_REJECTS)))
def test_no_rule_fires_where_none_is_meant_to(case):
    """The other bad specs are the structural schema's to refuse (or the model's): the rules stay quiet
    on those that are well-formed enough to run them."""
    obj = BAD[case]
    if ADMISSION.structural.validate(_defaulted(obj)) or case in MODEL_ONLY or case.startswith(("typo", "no metadata", "wrong")):
        return
    assert cel_messages(obj) == []


def _defaulted(obj: dict) -> dict:
    new = copy.deepcopy(obj)
    ADMISSION.structural.prune(new)
    ADMISSION.structural.default(new)
    return new


@pytest.mark.parametrize("case", sorted(set(BAD) - MODEL_ONLY))
def test_the_api_server_refuses_every_bad_spec_the_crd_can_express(case):
    """Parity with the model: `kubectl apply` (strict field validation) of each bad spec of the table
    is refused by the API server too, not only by the operator afterwards."""
    obj = BAD[case]
    if case in ("wrong apiVersion", "wrong kind", "no metadata"):
        pytest.skip("the API server routes by apiVersion/kind and requires metadata before the CRD's schema")
    with pytest.raises(Exception) as refused:
        ADMISSION.check(obj)
    assert getattr(refused.value, "status", None) in (400, 422), refused.value


@pytest.mark.parametrize("case", sorted(MODEL_ONLY))
def test_model_only_checks_are_the_model_only(case):
    ADMISSION.check(BAD[case])  # stored; the operator fails the job with the model's message


GOOD = [("base", base_job()), *[(name, obj) for name, obj in example_objects() if name not in LOCAL_EXAMPLES],
        ("all defaults", {**base_job(), "spec": api.DistributedTraining.model_validate(base_job()).spec.to_wire()}),
        ("gang", with_spec("scheduling", {"schedulerName": "volcano", "gang": {"enabled": True, "minAvailable": 2}})),
        ("kubernetes gang", with_spec("scheduling.gang", {"enabled": True, "provider": "kubernetes"})),
        ("env", with_spec("env", [{"name": "MY_FLAG", "value": "1"}, {"name": "PETS", "value": "cat"}])),
        ("nccl env", with_spec("nccl.env", {"NCCL_ALGO": "Ring", "TORCH_NCCL_BLOCKING_WAIT": "1"}))]


@pytest.mark.parametrize("name,obj", GOOD, ids=[g[0] for g in GOOD])
def test_good_specs_pass_every_rule(name, obj):
    assert cel_messages(obj) == []
    ADMISSION.check(obj)


# --- Transition rules (oldSelf) ----------------------------------------------------------------


def _stored(obj: dict) -> dict:
    return ADMISSION.check(obj)


def _edited(stored: dict, path: str, value) -> dict:
    new = copy.deepcopy(stored)
    node = new["spec"]
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return new


@pytest.mark.parametrize(
    "path,value,message",
    [
        ("nodes", 3, "spec.nodes is immutable"),
        ("devicesPerNode", 2, "spec.devicesPerNode is immutable"),
        ("trainer.batchSize", 64, "spec.trainer is immutable"),
        ("image", "registry.example/other:1", "spec.image is immutable"),
        ("runPolicy.backoffLimit", 9, "spec.runPolicy.backoffLimit is immutable"),
        ("runPolicy.restartPolicy", "Never", "spec.runPolicy.restartPolicy is immutable"),
        ("runPolicy.failureRules", [{"action": "FailJob"}], "spec.runPolicy.failureRules is immutable"),
        # Free-form values, compared whole: the operator runs the spec it accepted, so the API
        # server refuses what the operator would not apply.
        ("model", {"classPath": "dtrain_trainer.models.ImageClassifier", "initArgs": {"arch": "resnet50"}},
         "spec.model is immutable"),
        ("model.classPath", "mypkg.Other", "spec.model is immutable"),
        ("data", {"classPath": "dtrain_trainer.data.SyntheticImageDataModule", "initArgs": {"num_samples": 9}},
         "spec.data is immutable"),
        ("env", [{"name": "MY_FLAG", "value": "1"}], "spec.env is immutable"),
        ("volumes", [{"name": "scratch", "emptyDir": {}}], "spec.volumes is immutable"),
        ("volumeMounts", [{"name": "scratch", "mountPath": "/scratch"}], "spec.volumeMounts is immutable"),
        ("scheduling.nodeSelector", {"pool": "a100"}, "spec.scheduling may change only while the job is suspended"),
        ("scheduling.affinity", {"nodeAffinity": {}}, "spec.scheduling may change only while the job is suspended"),
    ],
)
def test_an_edit_of_an_immutable_field_is_rejected(path, value, message):
    stored = _stored(base_job())
    with pytest.raises(Exception, match=message) as refused:
        ADMISSION.check(_edited(stored, path, value), old=stored, field_validation="Ignore")
    assert refused.value.status == 422


def test_an_edit_inside_a_free_form_value_is_rejected():
    """Equality reaches into the fields the schema does not name (initArgs' keys, a volume's source)."""
    stored = _stored(with_spec("volumes", [{"name": "data", "persistentVolumeClaim": {"claimName": "a"}}]))
    edited = _edited(stored, "volumes", [{"name": "data", "persistentVolumeClaim": {"claimName": "b"}}])
    with pytest.raises(Exception, match="spec.volumes is immutable"):
        ADMISSION.check(edited, old=stored, field_validation="Ignore")
    stored = _stored(with_spec("env", [{"name": "MY_FLAG", "value": "1"}]))
    with pytest.raises(Exception, match="spec.env is immutable"):
        ADMISSION.check(_edited(stored, "env", [{"name": "MY_FLAG", "value": "2"}]), old=stored, field_validation="Ignore")


@pytest.mark.parametrize("path,value", [("runPolicy.suspend", True), ("runPolicy.ttlSecondsAfterFinished", 60)])
def test_an_edit_of_suspend_or_ttl_is_allowed(path, value):
    stored = _stored(base_job())
    ADMISSION.check(_edited(stored, path, value), old=stored, field_validation="Ignore")


def test_scheduling_may_change_while_the_job_is_suspended():
    """As for a suspended Kubernetes Job: Kueue sets where the pods run, then resumes, in one update;
    the operator applies the change once the job is Suspended (core.accepted.MUTABLE_WHEN_SUSPENDED)."""
    suspended = _stored(with_spec("runPolicy", {"suspend": True}))
    moved = _edited(suspended, "scheduling", {"nodeSelector": {"pool": "a100"}, "priorityClassName": "high"})
    ADMISSION.check(moved, old=suspended, field_validation="Ignore")
    admitted = _edited(moved, "runPolicy.suspend", False)
    ADMISSION.check(admitted, old=moved, field_validation="Ignore")
    # Suspending and moving in one update is refused: the job's pods may still be running.
    running = _stored(base_job())
    both = _edited(_edited(running, "runPolicy.suspend", True), "scheduling.nodeSelector", {"pool": "a100"})
    with pytest.raises(Exception, match="spec.scheduling may change only while the job is suspended"):
        ADMISSION.check(both, old=running, field_validation="Ignore")


def test_transition_rules_do_not_run_on_create():
    assert all(r.transition is False or "oldSelf" in r.rule for r in RULES)
    assert cel_messages(base_job()) == []  # no oldSelf: the immutability rules are skipped


def test_the_transition_rules_cover_what_the_model_calls_immutable():
    """Parity with api.immutable_spec, the spec the operator runs: every field of it has its rule."""
    spec_rules = " ".join(r.rule for r in RULES if r.path in ("spec", "spec.runPolicy") and r.transition)
    wire = api.immutable_spec(api.DistributedTrainingSpec())
    for field in wire:
        if field == "runPolicy":
            for sub in wire["runPolicy"]:
                assert f"self.{sub} == oldSelf.{sub}" in spec_rules, sub
        else:
            assert f"self.{field} == oldSelf.{field}" in spec_rules, field
    for field in api.MUTABLE_RUN_POLICY_FIELDS:
        assert f"self.{field} ==" not in spec_rules
