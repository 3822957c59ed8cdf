"""The wrong-jobs corpus (tests/corpus) before the session's real kube-apiserver: the children the operator
would send as its dry run (core/server_check.py) of each case that `dtrain validate` takes. A case marked
`# expect: server` gets a refusal containing its text; a working job gets none. `make e2e`'s scenario
`wrong-jobs` sends the same cases through the operator on `make cluster`."""

from __future__ import annotations

import pytest

from dtrain_operator.api import contract
from dtrain_operator.api.validation import validate_text
from dtrain_operator.core import server_check
from tests.corpus import Case, load_cases
from tests.kube_admission import KubeAdmission, Refused
from tests.unit.test_job_files import VOLUME, job_text
from tests.unit.test_wrong_jobs import DEFAULTS

NAMESPACE = "team-a"
CASES = [case for case in load_cases() if case.verdict in ("server", "accepted")]


@pytest.fixture(scope="module")
def team_a(admission: KubeAdmission) -> KubeAdmission:
    """team-a with the trainers' ServiceAccount: without it the ServiceAccount admission refuses every pod (403)
    before the pod's own validation is reached."""
    admission.namespace(NAMESPACE)
    try:
        admission.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": contract.DEFAULT_WORKER_SERVICE_ACCOUNT}})
    except Refused as refused:
        if refused.status != 409:
            raise
    return admission


def _refusals(admission: KubeAdmission, text: str) -> list[str]:
    job = validate_text(text, "job.yaml", cluster=True, defaults=DEFAULTS, namespace=NAMESPACE).job
    assert job is not None, "dtrain validate refuses it: it never reaches the server"
    job.metadata.namespace = NAMESPACE  # as `kubectl apply -n team-a` stores it
    refusals = []
    for child in server_check.children_to_check(job):
        if child["kind"] not in ("Pod", "Service", "ConfigMap", "Job"):
            continue  # other projects' kinds (PodGroups): this server does not serve them
        api = "/api/v1" if child["apiVersion"] == "v1" else f"/apis/{child['apiVersion']}"
        path = f"{api}/namespaces/{NAMESPACE}/{child['kind'].lower()}s"
        try:
            admission.request("POST", path, child, contract.dry_run_query(child["kind"]))
        except Refused as refused:
            refusal = server_check.dry_run_refusal(child, refused.status, str(refused))
            assert refusal is not None, f"{refused.status} {refused}: no verdict on the job"
            refusals.append(refusal)
    return refusals


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_the_api_server_gives_each_case_its_verdict(team_a: KubeAdmission, case: Case):
    refusals = _refusals(team_a, case.text)
    if case.verdict == "server":
        assert any(case.needle in refusal for refusal in refusals), refusals or "no child refused"
    else:
        assert refusals == []


# What `dtrain validate` passes through to the pods as written, and the server's verdict on it: (what is wrong,
# spec YAML, what the refusal says). A misspelt field is refused too: the dry run is Strict.
PASSED_THROUGH = [
    ("env empty valueFrom", "  env:\n    - name: A\n      valueFrom: {}\n", "valueFrom: Invalid value: \"\": must specify one of"),
    ("env two sources", "  env:\n    - name: A\n      valueFrom: {fieldRef: {fieldPath: metadata.name}, secretKeyRef: {name: s, key: k}}\n", "may not have more than one field specified at a time"),
    ("env unsupported fieldRef", "  env:\n    - name: A\n      valueFrom: {fieldRef: {fieldPath: spec.containers}}\n", "field label not supported: spec.containers"),
    ("env fieldRef label key", "  env:\n    - name: A\n      valueFrom: {fieldRef: {fieldPath: \"metadata.labels['a b']\"}}\n", "Invalid value: \"a b\": name part must consist of"),
    ("env unsupported resource", "  env:\n    - name: A\n      valueFrom: {resourceFieldRef: {resource: limits.gpu}}\n", "Unsupported value: \"limits.gpu\""),
    ("env secret without key", "  env:\n    - name: A\n      valueFrom: {secretKeyRef: {name: s}}\n", "valueFrom.secretKeyRef.key: Required value"),
    ("env secret name", "  env:\n    - name: A\n      valueFrom: {secretKeyRef: {name: My_Secret, key: k}}\n", "secretKeyRef.name: Invalid value: \"My_Secret\""),
    ("env source misspelt", "  env:\n    - name: A\n      valueFrom: {secretRef: {name: s}}\n", "].valueFrom.secretRef\""),
    ("volume name not a DNS label", "  volumes:\n    - name: Data\n      emptyDir: {}\n", "name: Invalid value: \"Data\": a lowercase RFC 1123 label"),
    ("volume with two sources", "  volumes:\n    - name: data\n      emptyDir: {}\n      configMap: {name: c}\n", "may not specify more than 1 volume type"),
    ("volume source of the wrong type", "  volumes:\n    - name: data\n      emptyDir: yes\n", "cannot unmarshal bool into Go struct field Volume.spec.volumes.VolumeSource.emptyDir"),
    ("volume claim without a name", "  volumes:\n    - name: data\n      persistentVolumeClaim: {}\n", "persistentVolumeClaim.claimName: Required value"),
    ("emptyDir size not a quantity", "  volumes:\n    - name: data\n      emptyDir: {sizeLimit: lots}\n", "quantities must match the regular expression"),
    ("mount subPath out of the volume", VOLUME + "  volumeMounts:\n    - {name: data, mountPath: /data, subPath: ../etc}\n", "subPath: Invalid value: \"../etc\": must not contain '..'"),
    ("toleration operator", "  scheduling:\n    tolerations: [{key: gpu, operator: Is}]\n", "spec.tolerations[0].operator: Unsupported value: \"Is\""),
    ("toleration Exists with a value", "  scheduling:\n    tolerations: [{key: gpu, operator: Exists, value: x}]\n", "value must be empty when `operator` is 'Exists'"),
    ("toleration seconds without NoExecute", "  scheduling:\n    tolerations: [{key: gpu, operator: Exists, tolerationSeconds: 60}]\n", "effect must be 'NoExecute' when `tolerationSeconds` is set"),
    ("toleration seconds as a string", "  scheduling:\n    tolerations: [{key: gpu, operator: Exists, effect: NoExecute, tolerationSeconds: '60'}]\n", "cannot unmarshal string into Go struct field Toleration.spec.tolerations.tolerationSeconds"),
    ("affinity of the wrong shape", "  scheduling:\n    affinity: {nodeAffinity: [a]}\n", "cannot unmarshal array into Go struct field Affinity.spec.affinity.nodeAffinity"),
    ("affinity misspelt", "  scheduling:\n    affinity: {nodeAfinity: {}}\n", "unknown field \"spec.affinity.nodeAfinity\""),
    ("affinity operator", "  scheduling:\n    affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: gpu, operator: Has}]}]}}}\n", "Invalid value: \"Has\": not a valid selector operator"),
    ("affinity In without values", "  scheduling:\n    affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: gpu, operator: In}]}]}}}\n", "values: Required value: must be specified when `operator` is 'In' or 'NotIn'"),
    ("affinity weight", "  scheduling:\n    affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 0, preference: {}}]}}\n", "weight: Invalid value: 0: must be in the range 1-100"),
    ("negative quantity", "  resources:\n    requests: {memory: -1Gi}\n", "requests[memory]: Invalid value: \"-1Gi\": must be greater than or equal to 0"),
    ("request above limit", "  resources:\n    requests: {cpu: '8'}\n    limits: {cpu: 4}\n", "must be less than or equal to cpu limit of 4"),
    ("fractional device", "  engine:\n    resources:\n      limits: {nvidia.com/gpu: '1.5'}\n", "limits[nvidia.com/gpu]: Invalid value: \"1500m\": must be an integer"),
    ("device request without limit", "  resources:\n    requests: {example.com/fpga: 1}\n", "Limit must be set for non overcommitable resources"),
    ("unknown resource", "  resources:\n    limits: {gpu: 1}\n", "limits[gpu]: Invalid value: \"gpu\": must be a standard resource type or fully qualified"),
    ("affinity without topologyKey", "  scheduling:\n    affinity: {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{labelSelector: {}}]}}\n", "topologyKey: Required value"),
]


@pytest.mark.parametrize("case,spec,expected", PASSED_THROUGH, ids=[case[0] for case in PASSED_THROUGH])
def test_what_a_pod_could_never_have_is_refused_by_the_api_server(team_a: KubeAdmission, case, spec, expected):
    refusals = _refusals(team_a, job_text(spec))
    assert refusals and expected in refusals[0], refusals
