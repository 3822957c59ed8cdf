"""`make e2e`'s scenario wrong-jobs: the wrong-jobs corpus (tests/corpus) and a few hundred generated working
variants of the quick start, each applied as a user's kubectl would send it, in team-a. Whatever the API server
takes, the operator either refuses before anything runs (InvalidSpec: its dry run of the children) or creates
every child of without a refusal: no job fails at child creation. The pods are pinned to a node that does not
exist, so that nothing trains: the scenario is about what the API server and the operator accept."""

from __future__ import annotations

import copy
import itertools
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import yaml
from localcluster import layout

from dtrain_operator.api import contract
from tests.corpus import load_cases

from .kube import Failed, kubectl

NS = layout.JOB_NAMESPACE
LABEL = "dtrain.dev/e2e"
NOWHERE = {"dtrain.dev/e2e-node": "none"}  # no node has it: every pod is created and none placed
SETTLE_SECONDS = 240.0
BASE = yaml.safe_load((layout.REPO / "examples" / "quickstart.yaml").read_text())

# Working variants of the quick start: one field of each kind the pods pass through, in the forms users write.
_ENV = [
    [{"name": "TEAM", "value": "a"}],
    [{"name": "MY_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    [{"name": "TEAM_LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['dtrain.dev/job-name']"}}}],
    [{"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}}],
    [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "token", "optional": True}}}],
    [{"name": "SETTING", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k", "optional": True}}}],
]
_VOLUMES = [
    ([{"name": "scratch", "emptyDir": {}}], [{"name": "scratch", "mountPath": "/scratch"}]),
    ([{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}], [{"name": "scratch", "mountPath": "/scratch"}]),
    ([{"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}], [{"name": "ram", "mountPath": "/ram"}]),
    ([{"name": "cfg", "configMap": {"name": "absent", "optional": True, "defaultMode": 0o440}}],
     [{"name": "cfg", "mountPath": "/etc/team", "readOnly": True}]),
    ([{"name": "keys", "secret": {"secretName": "absent", "optional": True, "items": [{"key": "k", "path": "k/key"}]}}],
     [{"name": "keys", "mountPath": "/etc/keys", "readOnly": True}]),
    ([{"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}],
     [{"name": "info", "mountPath": "/etc/podinfo"}]),
    ([{"name": "vault", "projected": {"sources": [{"serviceAccountToken": {"audience": "vault", "expirationSeconds": 3600,
                                                                           "path": "token"}}]}}],
     [{"name": "vault", "mountPath": "/var/run/vault", "readOnly": True}]),
    ([{"name": "scratch", "emptyDir": {}}], [{"name": "scratch", "mountPath": "/data/a", "subPath": "a"}]),
    ([{"name": "scratch", "emptyDir": {}}], [{"name": "scratch", "mountPath": "/data/b", "subPathExpr": "$(DTRAIN_POD_NAME)"}]),
]
_RESOURCES = [
    {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
    {"requests": {"ephemeral-storage": "1Gi"}},
    {"limits": {"cpu": "1.5", "memory": "3G"}},
]
_SCHEDULING = [
    {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]},
    {"tolerations": [{"operator": "Exists"}]},
    {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}]}]}}}},
    {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "other"}}}}]}}},
]


def generated_variants() -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, job): the quick start with each pass-through field in each form, on 1 to 3 nodes, engine on or off."""
    fields: list[tuple[str, dict[str, Any]]] = []
    fields += [(f"env{i}", {"env": env}) for i, env in enumerate(_ENV)]
    fields += [(f"vol{i}", {"volumes": v, "volumeMounts": m}) for i, (v, m) in enumerate(_VOLUMES)]
    fields += [(f"res{i}", {"resources": r}) for i, r in enumerate(_RESOURCES)]
    fields += [(f"sched{i}", {"scheduling": s}) for i, s in enumerate(_SCHEDULING)]
    fields += [("grace", {"terminationGracePeriodSeconds": 30}), ("port", {"masterPort": 29600}),
               ("pull", {"imagePullSecrets": [{"name": "registry"}]})]
    for (name, field), nodes, engine in itertools.product(fields, (1, 2, 3), (True, False)):
        job = copy.deepcopy(BASE)
        job["metadata"]["name"] = f"wj-{name}-n{nodes}{'' if engine else '-noengine'}"
        spec = job["spec"]
        spec.update(copy.deepcopy(field), nodes=nodes)
        spec["engine"]["enabled"] = engine
        yield job["metadata"]["name"], job


def _pinned(job: dict[str, Any]) -> dict[str, Any]:
    job = copy.deepcopy(job)
    job["metadata"].update(namespace=NS)
    job["metadata"].setdefault("labels", {})[LABEL] = "wrong-jobs"
    scheduling = job["spec"].setdefault("scheduling", {})
    if isinstance(scheduling, dict):
        scheduling["nodeSelector"] = {**(scheduling.get("nodeSelector") or {}), **NOWHERE}
    return job


def _create(job: dict[str, Any]) -> str:
    """'' when the API server took the job, else its message."""
    result = kubectl("create", "-f", "-", stdin=json.dumps(job), check=False)
    return "" if result.returncode == 0 else (result.stderr or result.stdout).strip()


def _settled(job: dict[str, Any], pods: dict[str, int]) -> str | None:
    """What became of a created job: Failed:<reason>, Refused:<reason>, Created, or None while it settles."""
    status = job.get("status") or {}
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    if status.get("phase") == "Failed":
        return f"Failed:{conditions.get('Failed', {}).get('reason', '')}"
    refused = conditions.get("CreateRefused")
    if refused and refused.get("status") == "True":
        return f"Refused:{refused.get('reason')}"
    return "Created" if pods.get(job["metadata"]["name"], 0) >= job["spec"]["nodes"] else None


def scenario_wrong_jobs(figures: dict[str, float]) -> None:
    corpus = {case.name: case for case in load_cases()}
    jobs = {name: yaml.safe_load(case.text) for name, case in corpus.items()}  # as kubectl reads YAML (1.1)
    jobs.update(generated_variants())
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        answers = dict(zip(jobs, pool.map(lambda job: _create(_pinned(job)), jobs.values())))
    created = {name for name, answer in answers.items() if not answer}
    outcomes: dict[str, str] = {}
    deadline = time.monotonic() + SETTLE_SECONDS
    while len(outcomes) < len(created) and time.monotonic() < deadline:
        listed = json.loads(kubectl("get", "dtr", "-n", NS, "-l", f"{LABEL}=wrong-jobs", "-o", "json").stdout)["items"]
        pod_list = json.loads(kubectl("get", "pods", "-n", NS, "-l", f"{contract.LABEL_ROLE}={contract.ROLE_WORKER}",
                                      "-o", "json").stdout)["items"]
        pods: dict[str, int] = {}
        for pod in pod_list:
            job_name = pod["metadata"]["labels"].get(contract.LABEL_JOB_NAME, "")
            pods[job_name] = pods.get(job_name, 0) + 1
        for job in listed:
            outcome = _settled(job, pods)
            if outcome is not None:
                outcomes[job["metadata"]["name"]] = outcome
        time.sleep(2)
    figures["wrong_jobs_settle_seconds"] = time.monotonic() - started
    problems = [f"{name}: never settled (neither refused nor all its pods created)" for name in created - set(outcomes)]
    problems += [f"{name}: {outcome} (a child the API server refused at its creation)"
                 for name, outcome in outcomes.items() if outcome not in ("Created", "Failed:InvalidSpec")]
    for name, case in corpus.items():
        outcome = outcomes.get(name) or ("refused at kubectl apply" if answers[name] else "")
        if case.verdict == "accepted" and outcome != "Created":
            problems.append(f"{name}: a working job, but {outcome or answers[name]}")
        if case.verdict == "server" and outcome == "Created":
            problems.append(f"{name}: the API server refuses its children ({case.needle}), but they were created")
    generated_refused = [name for name in jobs if name not in corpus and outcomes.get(name) != "Created"]
    problems += [f"{name}: a working variant, but {outcomes.get(name) or answers[name][:300]}" for name in generated_refused]
    counts = {outcome: list(outcomes.values()).count(outcome) for outcome in set(outcomes.values())}
    print(f"wrong-jobs: {len(jobs)} jobs ({len(corpus)} of the corpus): {len(jobs) - len(created)} refused at kubectl "
          f"apply, then {counts}, in {figures['wrong_jobs_settle_seconds']:.0f} s")
    kubectl("delete", "dtr", "-n", NS, "-l", f"{LABEL}=wrong-jobs", "--wait=true", "--timeout=180s")
    if problems:
        raise Failed("wrong-jobs:\n  " + "\n  ".join(problems[:40]) + (f"\n  and {len(problems) - 40} more" if len(problems) > 40 else ""))
