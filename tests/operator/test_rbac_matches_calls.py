"""The chart's RBAC grants exactly what the operator uses: every request of a full lifecycle is
recorded as (verb, apiGroup, resource[/subresource]) and compared with the rendered rules."""

from __future__ import annotations

import json
import ssl

import aiohttp
import kmock

from dtrain_operator.api import contract
from dtrain_operator.core import queueing
from tests.builders import a_cpu_job

from .cluster import Cluster
from .kmock_adapter import is_dry_run
from .operator_process import OPERATOR_AGENTS

NS = "default"
CHILD_KINDS = {"services", "pods", "jobs", "podgroups"}

# Setting blockOwnerDeletion on children's owner references needs `update` on the owner's
# finalizers where the OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift):
# an admission check, not a request, so the recorder cannot see it. The chart grants it when
# rbac.ownerReferencesPermissionEnforcement is set.
ADMISSION_ONLY = {(contract.GROUP, f"{contract.PLURAL}/finalizers", "update")}
ENFORCING_CLUSTER = {"rbac": {"ownerReferencesPermissionEnforcement": True}}


class FirstCreateOfEachKind:
    """Matches the operator's first creation of each kind of child (once per API group and plural)."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()

    def __call__(self, request) -> bool:
        if not (
            request.headers.get("User-Agent", "").startswith(OPERATOR_AGENTS)
            and request.action == kmock.action.CREATE
            and not is_dry_run(request)
            and request.resource.plural in CHILD_KINDS
        ):
            return False
        kind = (request.resource.group, request.resource.plural)
        if kind in self.seen:
            return False
        self.seen.add(kind)
        return True


async def full_lifecycle(cluster: Cluster, report_port: int) -> None:
    """Create, conflicts, running, immutable change, restart, suspend/resume, engine Job, success,
    cleanup, TTL deletion; two more jobs gang-scheduled by scheduler-plugins and by Kubernetes itself;
    and a restart in place (its pod relabelled)."""
    # A 409 for creations that meet an object of the same name: the operator reads it back.
    cluster.api.faults.fail(FirstCreateOfEachKind(), status=409, reason="AlreadyExists")
    life = a_cpu_job("life").with_nodes(2).with_engine().with_gang_scheduling("volcano")
    await cluster.apply(life.with_clean_pod_policy("All").with_ttl(1).as_dict())
    cosched = a_cpu_job("cosched").with_nodes(1).with_gang_scheduling("scheduler-plugins-scheduler")
    await cluster.apply(cosched.as_dict())
    await cluster.apply(a_cpu_job("native").with_nodes(1).with_native_gang_scheduling().as_dict())
    await cluster.apply(a_cpu_job("queued").with_nodes(1).in_queue("team-a").as_dict())
    await cluster.run_all(NS, "life", 2)
    await cluster.phase(NS, "life", "Running")

    # An edit the CRD's rules refuse, stored as with a CRD from before them: the operator reports it.
    await cluster.patch_job(NS, "life", {"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]}})
    await cluster.eventually(lambda: (cluster.condition(NS, "life", "SpecImmutable") or {}).get("status") == "True",
                             "SpecImmutable")
    # A second warning of the same kind counts up the first Event (a patch) rather than posting another.
    await cluster.patch_job(NS, "life", {"spec": {"scheduling": {"affinity": {"nodeAffinity": {}}}}})
    await cluster.eventually(
        lambda: [e.get("count") for e in cluster.events(NS, "life") if e["reason"] == "SpecImmutable"] == [2],
        "the SpecImmutable Event counted twice",
    )
    await cluster.exit(NS, "life-1", 1)
    await cluster.eventually(lambda: cluster.status(NS, "life").get("restarts") == 1, "a gang restart")
    await cluster.eventually(
        lambda: {p["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for p in cluster.pods(NS, "life")} == {"1"}
        and len(cluster.pods(NS, "life")) == 2, "the new gang")
    await cluster.patch_job(NS, "life", {"spec": {"runPolicy": {"suspend": True}}})
    await cluster.phase(NS, "life", "Suspended")
    # The phase is written before the pods go: resumed earlier, run_all could start a pod on its way out.
    await cluster.eventually(lambda: cluster.pods(NS, "life") == [], "the suspended gang's pods gone")
    await cluster.patch_job(NS, "life", {"spec": {"runPolicy": {"suspend": False}}})
    await cluster.run_all(NS, "life", 2)
    await cluster.phase(NS, "life", "Running")

    await cluster.exit(NS, "life-0", 0, json.dumps({"onnx": "/workspace/artifacts/model.onnx"}))
    await cluster.phase(NS, "life", "BuildingEngine")
    await cluster.finish_engine_job(NS, "life", succeeded=True, message=json.dumps({"engine": "model.plan"}))
    # Its TTL of 1 s may delete it before a look sees it Succeeded.
    await cluster.eventually(
        lambda: cluster.job(NS, "life") is None or cluster.status(NS, "life").get("phase") == "Succeeded", "Succeeded")
    await cluster.eventually(lambda: cluster.job(NS, "life") is None, "the TTL deletion")
    await cluster.eventually(lambda: cluster.pods(NS, "cosched"), "the second job's pod")
    await cluster.eventually(lambda: cluster.pods(NS, "native"), "the third job's pod")
    # A job in a Kueue queue: its pod held by Kueue's admission gate (as Kueue's webhook adds it), the operator
    # reads Kueue's Workload and LocalQueue to say where it waits (this API server has neither: 404).
    await cluster.eventually(lambda: cluster.pods(NS, "queued"), "the queued job's pod")
    await cluster.patch(f"/api/v1/namespaces/{NS}/pods/queued-0", {"spec": {"schedulingGates": [{"name": queueing.ADMISSION_GATE}]}})
    await cluster.phase(NS, "queued", "Queued")
    await restart_in_place(cluster, report_port)


def operator_ca(cluster: Cluster, namespace: str, job: str) -> str:
    """The report endpoint's CA, as the operator hands it to the job's pods (an annotation of each)."""
    pod = cluster.pods(namespace, job)[0]
    return pod["metadata"]["annotations"][contract.TRAINER_FILE_ANNOTATIONS[contract.OPERATOR_CA_FILE_NAME]]


async def supervisor_report(cluster: Cluster, port: int, job: str, pod: dict, report: dict) -> tuple[int, dict]:
    """A pod's supervisor's launch report to the report endpoint, with a token the API server binds to the pod."""
    token = f"token-of-{pod['metadata']['name']}"
    cluster.api.tokens[token] = (pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"])
    context = ssl.create_default_context(cadata=operator_ca(cluster, NS, job))
    context.check_hostname = False  # 127.0.0.1, not the Service's name
    async with aiohttp.ClientSession() as session:
        url = f"https://127.0.0.1:{port}{contract.launch_path(NS, job)}"
        async with session.post(url, json=report, headers={"Authorization": f"Bearer {token}"}, ssl=context) as reply:
            return reply.status, await reply.json()


async def restart_in_place(cluster: Cluster, report_port: int) -> None:
    """A supervisor reports its torchrun exited 1: the gang restarts in place, its pod relabelled (patched), and the
    answer, held until then, tells the supervisor to run the new generation."""
    await cluster.apply(a_cpu_job("inplace").with_nodes(1).as_dict())
    (pod,) = await cluster.run_all(NS, "inplace", 1)
    await cluster.phase(NS, "inplace", "Running")
    exited = {"generation": 0, "state": "exited", "exitCode": 1, "reason": "Error", "message": "boom", "sequence": 1}
    status, order = await supervisor_report(cluster, report_port, "inplace", cluster.pod(NS, "inplace-0"), exited)
    assert (status, order["action"], order["generation"]) == (200, "run", 1), order
    (same,) = cluster.pods(NS, "inplace")
    assert same["metadata"]["uid"] == pod["metadata"]["uid"]
    assert same["metadata"]["labels"][contract.LABEL_GANG_GENERATION] == "1"
    now = cluster.status(NS, "inplace")
    assert (now["restarts"], now["restartsInPlace"], now["lastRestart"]["strategy"]) == (1, 1, "InPlace")


def operator_calls(cluster: Cluster) -> set[tuple[str, str, str]]:
    return {(c.api_group, c.rbac_resource, c.verb) for c in cluster.api.calls_by(*OPERATOR_AGENTS)}


def difference_report(used: set, granted: set) -> str:
    missing = sorted(used - granted)
    extra = sorted(granted - used)
    return f"used but not granted: {missing}\ngranted but never used: {extra}"


async def a_report(cluster: Cluster, port: int, namespace: str = NS, job: str = "cosched") -> None:
    """One report to the operator's report endpoint: it asks the API server for a TokenReview (this
    API server has none to give, so the report is refused; the real one answers in `make e2e`)."""
    context = ssl.create_default_context(cadata=operator_ca(cluster, namespace, job))
    context.check_hostname = False  # 127.0.0.1, not the Service's name
    async with aiohttp.ClientSession() as session:
        url = f"https://127.0.0.1:{port}{contract.report_path(namespace, job)}"
        async with session.post(url, json={"records": []}, headers={"Authorization": "Bearer t"}, ssl=context) as reply:
            assert reply.status in (401, 503)


async def test_cluster_role_grants_exactly_what_the_operator_uses(cluster: Cluster):
    from tests.chart.helm import granted, helm_template, rbac_rules

    operator = await cluster.start_operator()
    await full_lifecycle(cluster, operator.report_port)
    await a_report(cluster, operator.report_port)
    # The Lease renewed at least once (a patch), every retry period.
    await cluster.eventually(lambda: ("coordination.k8s.io", "leases", "patch") in operator_calls(cluster), "a renewal")
    used = operator_calls(cluster)
    rules = granted(rbac_rules(helm_template()))
    assert used == rules, difference_report(used, rules)
    enforcing = granted(rbac_rules(helm_template(ENFORCING_CLUSTER)))
    assert used | ADMISSION_ONLY == enforcing, difference_report(used | ADMISSION_ONLY, enforcing)


async def test_namespaced_install_grants_what_the_operator_uses_in_each_namespace(cluster: Cluster):
    from tests.chart.helm import granted, helm_template, of_kind, rbac_rules

    operator = await cluster.start_operator("--namespace=team-a", "--namespace=team-b")
    await cluster.apply(a_cpu_job("scoped").in_namespace("team-a").with_nodes(1).as_dict())
    await cluster.run_all("team-a", "scoped", 1)
    await cluster.phase("team-a", "scoped", "Running")
    await cluster.exit("team-a", "scoped-0", 1)
    await cluster.eventually(lambda: cluster.status("team-a", "scoped").get("restarts") == 1, "a restart")
    await cluster.apply(a_cpu_job("elsewhere").in_namespace("team-c").with_nodes(1).as_dict())
    await a_report(cluster, operator.report_port, "team-a", "scoped")

    objects = helm_template({"watchNamespaces": ["team-a", "team-b"]})
    used = operator_calls(cluster)
    # The one cluster-wide call: the report endpoint's TokenReview (cluster-scoped in the API).
    cluster_scoped = granted(rbac_rules(of_kind(objects, "ClusterRole")))
    token_review = {("authentication.k8s.io", "tokenreviews", "create")}
    assert cluster_scoped == token_review, f"a namespaced operator makes one cluster-wide call, but it is granted {cluster_scoped}"
    used -= token_review
    # Its Lease and the key of its records live in its own namespace (the release's), with Roles of their own there.
    own_namespace_calls = {call for call in used if call[:2] in (("coordination.k8s.io", "leases"), ("", "secrets"))}
    assert ("coordination.k8s.io", "leases", "create") in own_namespace_calls, "leader election made no call"
    for namespace in ("team-a", "team-b"):
        roles = [r for r in of_kind(objects, "Role") if r["metadata"]["namespace"] == namespace]
        in_namespace = granted(rbac_rules(roles))
        assert used - own_namespace_calls <= in_namespace, difference_report(used - own_namespace_calls, in_namespace)
    own = granted(rbac_rules([r for r in of_kind(objects, "Role") if r["metadata"]["namespace"] == "dtrain-system"]))
    assert own_namespace_calls <= own, difference_report(own_namespace_calls, own)
    # It watches only its namespaces: a job elsewhere is never seen.
    assert cluster.status("team-c", "elsewhere") == {}


async def test_network_policy_install_grants_what_the_operator_uses(cluster: Cluster):
    """networkPolicy.enabled: the operator creates one NetworkPolicy per job, and may."""
    from tests.chart.helm import granted, helm_template, rbac_rules

    await cluster.start_operator("--network-policy")
    await cluster.apply(a_cpu_job("fenced").with_nodes(2).as_dict())
    await cluster.run_all(NS, "fenced", 2)
    await cluster.phase(NS, "fenced", "Running")
    [policy] = cluster.objects("networking.k8s.io/v1/networkpolicies", NS, "fenced")
    own = {contract.LABEL_JOB_NAME: "fenced"}
    assert policy["spec"] == {
        "podSelector": {"matchLabels": own},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": own}}]}],
    }
    assert policy["metadata"]["ownerReferences"][0]["name"] == "fenced"
    for pod in cluster.pods(NS, "fenced"):
        assert pod["metadata"]["labels"][contract.LABEL_JOB_NAME] == "fenced"  # selected by the policy
    used = operator_calls(cluster)
    assert ("networking.k8s.io", "networkpolicies", "create") in used
    rules = granted(rbac_rules(helm_template({"networkPolicy": {"enabled": True}})))
    assert used <= rules, difference_report(used, rules)
    assert ("networking.k8s.io", "networkpolicies", "create") not in granted(rbac_rules(helm_template()))
