"""What the API server enforces for the users and the pods, checked with their own credentials: the
chart's admission policies and RBAC, the status record, the report endpoint and the workers' tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from localcluster import layout

from dtrain_operator.api import contract
from dtrain_operator.controller import report_limits

from ..kube import (
    Failed,
    apply,
    eventually,
    get,
    kubectl,
    pod_netns,
    request_with_token,
    status,
    user_kubeconfig,
    worker_pods,
)
from .common import NS, SMALL_JOB, Figures, delete, finished, lease_holder, operator_pods, pod, progress_step, small_job
from .control_plane import helm_upgrade


def _refused(result, *fragments: str) -> None:
    text = result.stderr + result.stdout
    if result.returncode == 0 or not all(f in text for f in fragments):
        raise Failed(f"expected a refusal naming {fragments}, got rc {result.returncode}: {text.strip()[:600]}")


def dtr_editor() -> Path:
    """The kubeconfig of a user who may edit DistributedTrainings in the jobs' namespace and nothing else."""
    kubectl("create", "role", "dtr-editor", "-n", NS, "--verb=get,list,watch,create,update,patch,delete",
            "--resource=distributedtrainings.dtrain.dev", check=False)
    kubectl("create", "rolebinding", "alice-dtr-editor", "-n", NS, "--role=dtr-editor", "--user=alice@example.com",
            check=False)
    return user_kubeconfig("alice@example.com")


OPERATOR_SECRETS = ("dtrain-operator-report-tls",)


def secrets_named(pod: dict[str, Any]) -> set[str]:
    """The Secrets a pod's volumes and environment read."""
    named = set()
    for volume in pod["spec"].get("volumes") or []:
        named.add((volume.get("secret") or {}).get("secretName"))
        named.update((source.get("secret") or {}).get("name") for source in (volume.get("projected") or {}).get("sources") or [])
    for container in pod["spec"].get("containers") or []:
        named.update(((var.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name") for var in container.get("env") or [])
    return named - {None}


def scenario_tenancy(figures: Figures) -> None:
    """A user who may edit DistributedTrainings in the jobs' namespace and nothing else: a job as the operator's
    account, naming the operator's Secrets, asking for an API token or an account no administrator allowed is
    refused at kubectl apply (the chart's policy), in the operator's namespace too, and no pod with that identity
    or Secret ever exists; an account the chart allows runs."""
    alice = dtr_editor()
    operator_namespace = "dtrain-system"
    api_token = [{"name": "api", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]
    api_mount = [{"name": "api", "mountPath": "/api"}]
    attempts: list[tuple[str, dict[str, Any], str]] = [
        ("the operator's account", {"serviceAccountName": "dtrain-operator"}, "the dtrain operator's own account"),
        ("the report endpoint's key as a volume", {
            "volumes": [{"name": "key", "secret": {"secretName": OPERATOR_SECRETS[0]}}],
            "volumeMounts": [{"name": "key", "mountPath": "/key"}]}, "names a Secret of the dtrain operator's"),
        ("the report endpoint's key in env", {"env": [{"name": "TLS", "valueFrom": {"secretKeyRef": {
            "name": OPERATOR_SECRETS[0], "key": "tls.key"}}}]}, "names a Secret of the dtrain operator's"),
        ("a token for the API", {"volumes": api_token, "volumeMounts": api_mount}, "a token for the Kubernetes API"),
        ("an account not allowed", {"serviceAccountName": "e2e-iam"}, "this account is not allowed in this namespace"),
    ]
    for what, spec, message in attempts:
        _refused(apply(small_job("e2e-tenancy", **spec), kubeconfig=alice, check=False), message)
        at_home = small_job("e2e-tenancy", **spec)
        at_home["metadata"]["namespace"] = operator_namespace
        # Alice has no right there at all; an administrator is refused by the policy.
        _refused(apply(at_home, kubeconfig=alice, check=False), "forbidden")
        _refused(apply(at_home, check=False), f"{operator_namespace} is the dtrain operator's own namespace")
        print(f"refused in {NS} and {operator_namespace}: {what}", flush=True)
    for running in json.loads(kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]:
        where = f"{running['metadata']['namespace']}/{running['metadata']['name']}"
        if running["spec"].get("serviceAccountName") == "dtrain-operator" and running["metadata"]["namespace"] != operator_namespace:
            raise Failed(f"{where} runs as the operator's account")
        if secrets_named(running) & set(OPERATOR_SECRETS):
            raise Failed(f"{where} reads a Secret of the operator's: {secrets_named(running)}")
    # An administrator allows one account in the jobs' namespace: it runs there, and nowhere else.
    kubectl("create", "serviceaccount", "e2e-iam", "-n", NS, check=False)
    helm_upgrade(f"tenancy.allowedServiceAccounts={{{NS}/e2e-iam}}")
    # The upgraded operator (its new flag) leads before the job is made: the old one would refuse it.
    eventually(lambda: len(pods := operator_pods()) == 1 and lease_holder() == pods[0]["metadata"]["name"],
               "the upgraded operator leading", 120)
    name = "e2e-tenancy-iam"
    allowed = small_job(name, serviceAccountName="e2e-iam", volumes=api_token, volumeMounts=api_mount)
    # The API server takes the policy's new values within a moment of the upgrade.
    eventually(lambda: apply(allowed, kubeconfig=alice, check=False).returncode == 0, f"{name} admitted", 60)
    pods = eventually(lambda: len(p := worker_pods(name)) == 2 and p, f"{name}: its pods", 120)
    if {p["spec"]["serviceAccountName"] for p in pods} != {"e2e-iam"}:
        raise Failed(f"{name}: pods run as {[p['spec']['serviceAccountName'] for p in pods]}, expected e2e-iam")
    delete(name)


def scenario_status_record(figures: Figures) -> None:
    """A user's own credentials: the status, the operator's record of each job, can be neither written nor set."""
    alice = dtr_editor()
    job = small_job("e2e-status-record")
    job["spec"]["runPolicy"]["suspend"] = True  # nothing to run: only its status matters here
    forged = {**job, "status": {"phase": "Running", "restarts": 0,
                                "acceptedSpec": {**job["spec"], "hostNetwork": True}}}
    apply(forged, kubeconfig=alice)
    status = eventually(lambda: (s := get("dtr", "e2e-status-record", NS).get("status") or {}).get("acceptedSpec") and s,
                        "the operator's own status", 60)
    if status["acceptedSpec"].get("hostNetwork"):
        raise Failed("the status written at create was kept")
    patch = json.dumps({"status": {"restarts": 9}})
    _refused(kubectl("patch", "dtr", "e2e-status-record", "-n", NS, "--subresource=status", "--type=merge", "-p", patch,
                     kubeconfig=alice, check=False), "forbidden")
    # The chart's roles aggregated into Kubernetes' own: a namespace's editors edit jobs, never their status.
    kubectl("create", "rolebinding", "bob-edit", "-n", NS, "--clusterrole=edit", "--user=bob@example.com", check=False)
    for verb, extra, expected in (("create", (), "yes"), ("delete", (), "yes"), ("patch", ("--subresource=status",), "no"),
                                  ("update", ("--subresource=status",), "no")):
        answer = kubectl("auth", "can-i", verb, "distributedtrainings.dtrain.dev", "-n", NS, *extra,
                         "--as=bob@example.com", check=False).stdout.strip()
        if answer != expected:
            raise Failed(f"the edit role may {verb} distributedtrainings {' '.join(extra)}: {answer}, expected {expected}")
    kubectl("delete", "dtr", "e2e-status-record", "-n", NS, "--wait=false", kubeconfig=alice)

REPORT_SERVICE = "dtrain-operator.dtrain-system.svc"
# Run in a pod's network namespace (its hosts file is the cluster's DNS here): one report to the
# operator's Service, each address in turn past a standby's 503; prints the HTTP status.
POST_REPORT = """
import http.client, json, socket, ssl, sys
host, port, path, ca, token = sys.argv[1:6]
body = json.dumps({"records": [{"event": "progress", "step": 1, "time": "2026-12-02T00:00:00Z"}]})
status = 0
for address in sorted({i[4][0] for i in socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)}):
    context = ssl.create_default_context(cafile=ca)
    sock = context.wrap_socket(socket.create_connection((address, int(port)), 10), server_hostname=host)
    connection = http.client.HTTPSConnection(host, int(port))
    connection.sock = sock
    connection.request("POST", path, body, {"Authorization": f"Bearer {token}"} if token else {})
    status = connection.getresponse().status
    if status != 503:
        break
print(status)
"""


def report_from(pod: dict[str, Any], job: str, ca: Path, token: str | None) -> int:
    """The HTTP status the operator answers a report from inside `pod`'s network namespace."""
    result = subprocess.run(
        ["ip", "netns", "exec", pod_netns(pod), sys.executable, "-c", POST_REPORT, REPORT_SERVICE,
         str(contract.DEFAULT_REPORT_PORT), contract.report_path(NS, job), str(ca), token or ""],
        check=False, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise Failed(f"a report from {pod['metadata']['name']} did not reach the operator: {result.stderr[-600:]}")
    return int(result.stdout.split()[-1])


# Run in an attacking pod's network namespace: idle TLS connections to the report endpoint, held, and reports as
# fast as it can send them (oversized ones with its own rank 0's token, empty ones with made-up tokens) for a while.
ATTACK = r"""
import collections, http.client, json, socket, ssl, sys, time
host, port, path, ca, token, seconds = sys.argv[1:7]
addresses = sorted({i[4][0] for i in socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)})
context = ssl.create_default_context(cafile=ca)
held, closed = [], 0
for n in range(300):
    try:
        held.append(context.wrap_socket(socket.create_connection((addresses[n % len(addresses)], int(port)), 5),
                                        server_hostname=host))
    except OSError:
        closed += 1
huge = json.dumps({"records": [{"event": "progress", "step": 1, "metrics": {f"m{i}": 1.0 for i in range(500)}}]})
answers = collections.Counter()
deadline = time.monotonic() + float(seconds)
while time.monotonic() < deadline:
    for body, bearer in ((huge, token), ('{"records": []}', "made-up-token")):
        try:
            connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=5)
            connection.request("POST", path, body, {"Authorization": f"Bearer {bearer}"})
            answers[str(connection.getresponse().status)] += 1
            connection.close()
        except (OSError, http.client.HTTPException):
            answers["no answer"] += 1
print(json.dumps({"connections": len(held), "closed": closed, "answers": answers}))
"""


def scenario_report_flood(figures: Figures) -> None:
    """One job's pod attacks the report endpoint (held idle connections, reports as fast as it can, oversized and
    with made-up tokens) while another job trains: that job's progress keeps reaching its status, it restarts
    nothing and Succeeds, and the operator's container is not restarted."""
    honest, attacker = "e2e-honest", "e2e-attacker"
    long = {**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": 400}
    apply(small_job(honest))
    apply(small_job(attacker, nodes=1, trainer=long))
    eventually(lambda: progress_step(honest) > 0, f"{honest}: training", 300)
    victim = eventually(lambda: (p := pod(f"{attacker}-0"))["status"].get("phase") == "Running" and p,
                        f"{attacker}: its pod Running", 300)
    restarts = operator_pods()[0]["status"]["containerStatuses"][0]["restartCount"]
    ca = layout.STATE / "e2e-operator-ca.crt"
    ca.write_text(victim["metadata"]["annotations"][contract.TRAINER_FILE_ANNOTATIONS[contract.OPERATOR_CA_FILE_NAME]])
    token = kubectl("create", "token", "dtrain-trainer", "-n", NS, "--bound-object-kind=Pod",
                    f"--bound-object-name={attacker}-0", f"--audience={contract.OPERATOR_TOKEN_AUDIENCE}").stdout.strip()
    before = progress_step(honest)
    # The held connections fill the pod's places until the endpoint closes them (idle, then the TLS close's
    # bound): the reports that come after are the ones answered, 413 or 429, so the attack outlasts that.
    seconds = report_limits.IDLE_SECONDS + report_limits.HANDSHAKE_SECONDS + 20
    attack = subprocess.run(
        ["ip", "netns", "exec", pod_netns(victim), sys.executable, "-c", ATTACK, REPORT_SERVICE,
         str(contract.DEFAULT_REPORT_PORT), contract.report_path(NS, attacker), str(ca), token, str(seconds)],
        check=False, capture_output=True, text=True, timeout=180)
    if attack.returncode != 0:
        raise Failed(f"the attack did not run: {attack.stderr[-800:]}")
    outcome = json.loads(attack.stdout.strip().splitlines()[-1])
    print(f"the attacker's pod: {outcome}", flush=True)
    if outcome["answers"].get("204") or not (outcome["answers"].get("429") or outcome["answers"].get("413")):
        raise Failed(f"the endpoint took the attack's reports: {outcome['answers']}")
    if progress_step(honest) <= before and status(honest).get("phase") != "Succeeded":
        raise Failed(f"{honest}: no progress in its status during the attack (step {before})")
    final = finished(honest)
    if final["restarts"] != 0:
        raise Failed(f"{honest}: {final['restarts']} restarts during another job's attack")
    if operator_pods()[0]["status"]["containerStatuses"][0]["restartCount"] != restarts:
        raise Failed("the operator's container restarted during the attack")
    metrics = (status(attacker).get("progress") or {}).get("metrics") or {}
    if len(metrics) > 64:
        raise Failed(f"{attacker}'s status took {len(metrics)} metrics")
    delete(honest)
    delete(attacker)


def workers_hold_one_token_for_the_operator(rank0: dict[str, Any], rank1: dict[str, Any]) -> None:
    """No worker mounts a token for the API server; each holds one projected token, for the operator's audience."""
    for worker in (rank0, rank1):
        if worker["spec"].get("automountServiceAccountToken") is not False:
            raise Failed(f"{worker['metadata']['name']} mounts a token for the API server")
    for worker in (rank0, rank1):
        projected = [v["projected"] for v in worker["spec"]["volumes"] if "projected" in v]
        audiences = [s["serviceAccountToken"]["audience"] for p in projected for s in p["sources"]]
        if audiences != [contract.OPERATOR_TOKEN_AUDIENCE]:
            raise Failed(f"{worker['metadata']['name']} should hold one token, for the operator; it holds {audiences}")


def reports_judged_by_their_token(name: str, rank0: dict[str, Any], rank1: dict[str, Any]) -> str:
    """Reports to the operator from rank 1's pod with each kind of token, answered as the operator's TokenReview
    judges them; returns rank 0's token for the operator's audience."""
    ca = layout.STATE / "e2e-operator-ca.crt"
    ca.write_text(rank0["metadata"]["annotations"][contract.TRAINER_FILE_ANNOTATIONS[contract.OPERATOR_CA_FILE_NAME]])

    def minted(pod_name: str, audience: str | None) -> str:
        args = ["create", "token", "dtrain-trainer", "-n", NS, "--bound-object-kind=Pod", f"--bound-object-name={pod_name}"]
        return kubectl(*args, *([f"--audience={audience}"] if audience else [])).stdout.strip()

    rank0_token = minted(f"{name}-0", contract.OPERATOR_TOKEN_AUDIENCE)
    cases = [
        ("no token", None, 401),
        ("a made-up token", "not-a-token", 401),
        ("rank 0's token for the API server's audience", minted(f"{name}-0", None), 401),
        ("rank 1's token for the operator", minted(f"{name}-1", contract.OPERATOR_TOKEN_AUDIENCE), 403),
        ("rank 0's token for the operator", rank0_token, 204),
    ]
    for who, token, expected in cases:
        answer = report_from(rank1, name, ca, token)
        if answer != expected:
            raise Failed(f"a report with {who} was answered {answer}, expected {expected}")
    return rank0_token


def accounts_hold_only_their_rights(rank0_token: str) -> None:
    """The API server refuses a token for the operator's audience, the trainers' account may do nothing, and the
    operator's account may do what reconciling needs and no more."""
    code, text = request_with_token(rank0_token, "GET", "/apis")
    if code != 401:
        raise Failed(f"the API server took a token for the operator's audience: {code} {text[:300]}")
    trainer = f"system:serviceaccount:{NS}:dtrain-trainer"
    for verb, resource, extra in (("patch", "distributedtrainings.dtrain.dev", ("--subresource=status",)),
                                  ("get", "distributedtrainings.dtrain.dev", ()), ("list", "pods", ()),
                                  ("get", "secrets", ()), ("create", "pods", ())):
        answer = kubectl("auth", "can-i", verb, resource, "-n", NS, *extra, f"--as={trainer}", check=False).stdout.strip()
        if answer != "no":
            raise Failed(f"the trainers' service account may {verb} {resource}: {answer}")
    operator = "system:serviceaccount:dtrain-system:dtrain-operator"
    status_subresource = "--subresource=status"
    # (who, the expected answer, verb, resource; the namespace and subresource as kubectl auth can-i takes them)
    checks: list[tuple[str, str, str, str, tuple[str, ...]]] = [
        (operator, "yes", "list", "distributedtrainings.dtrain.dev", ("--all-namespaces",)),
        (operator, "yes", "list", "pods", ("-n", NS)),
        (operator, "yes", "create", "pods", ("-n", NS)),
        # Its record of each job is the status; the object itself is the user's.
        (operator, "no", "patch", "distributedtrainings.dtrain.dev", ("-n", NS)),
        (operator, "yes", "patch", "distributedtrainings.dtrain.dev", ("-n", NS, status_subresource)),
        (operator, "yes", "create", "tokenreviews.authentication.k8s.io", ()),
        (operator, "no", "get", "secrets", ("-n", NS)),
        (operator, "no", "get", "secrets", ("-n", "kube-system")),
        (operator, "no", "create", "clusterrolebindings", ("-n", NS)),
        (operator, "yes", "get", "secrets/dtrain-operator-report-tls", ("-n", "dtrain-system")),
    ]
    for who, expected, verb, resource, where in checks:
        answer = kubectl("auth", "can-i", verb, resource, *where, f"--as={who}", check=False).stdout.strip()
        if answer != expected:
            raise Failed(f"{who} may {verb} {resource} {' '.join(where)}: {answer}, expected {expected}")


def scenario_tokens(figures: Figures) -> None:
    """Workers hold no API permission: progress reaches the status through the operator alone, which
    takes it only with a token for its audience bound to the job's rank-0 pod (the API server's
    TokenReview); each worker holds one such token (its supervisor reports its launch with it); the API
    server refuses that token, and every token of the trainers' account."""
    name = "e2e-tokens"
    apply(small_job(name, trainer={**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": 40}))
    eventually(lambda: len([p for p in worker_pods(name) if p["status"].get("phase") == "Running"]) == 2,
               f"{name}: two Running workers", 300)
    rank0, rank1 = (pod(f"{name}-{rank}") for rank in (0, 1))
    workers_hold_one_token_for_the_operator(rank0, rank1)
    # Rank 0's records reach the status, which only the operator writes.
    eventually(lambda: (get("dtr", name, NS).get("status", {}).get("progress") or {}).get("gangGeneration") == 0,
               f"{name}: progress in the status, stamped by the operator", 300)
    rank0_token = reports_judged_by_their_token(name, rank0, rank1)
    accounts_hold_only_their_rights(rank0_token)
    kubectl("delete", "dtr", name, "-n", NS, "--wait=false")
