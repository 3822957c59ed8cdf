"""The operator's test bench on the real API server: cluster.Cluster's API over HTTPS, as the admin, against
one upstream etcd, kube-apiserver and kube-controller-manager per pytest worker (tests/control_plane.py),
the CRD of this checkout installed (tests/kube_admission.py). The server judges every object (its schema,
CEL rules, pod validation, admission), collects children through their owner references (the controller
manager's garbage collector), and answers watches, lists and conflicts as a cluster does.

No scheduler, no kubelet and no Job controller: the tests play them. A pod the test kubelet runs is bound to a
node first (as the scheduler would); a bound pod, deleted, stays Terminating until a kubelet confirms, so the
test kubelet confirms at once (a delete with no grace) unless the test holds the pod (hold_termination); a
force delete by the operator takes a held pod at once, as on a cluster whose kubelet no longer answers. What
the emulator adds for the other tests (faults, admission refusals, TokenReview of made-up tokens, objects the
CRD would refuse) is not here: those tests keep the emulator.

Each test leaves the server as it found it: at its end its operators stop and every object of the kinds the
operator makes, in every namespace the test used, is deleted (pods at once, as a force delete).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from dtrain_operator.api import contract
from tests.control_plane import AuditLog, ControlPlane
from tests.kube_admission import KubeAdmission

from .cluster import Cluster
from .operator_process import OPERATOR_AGENTS, OPERATOR_NAMESPACE

NODE = "node-1"  # where the test scheduler binds pods (no Node object: nothing here reads it)
TRAINER_ACCOUNT = "dtrain-trainer"  # the account the operator's pods run as (the chart makes it in each user namespace)
# What a test may leave behind, deleted at its end: (API path prefix, plural).
LEFTOVERS = (
    (f"/apis/{contract.API_VERSION}", contract.PLURAL), ("/api/v1", "pods"), ("/api/v1", "services"),
    ("/api/v1", "configmaps"), ("/api/v1", "events"), ("/apis/batch/v1", "jobs"),
    ("/apis/networking.k8s.io/v1", "networkpolicies"), ("/apis/coordination.k8s.io/v1", "leases"),
    ("/api/v1", "secrets"), ("/api/v1", "serviceaccounts"),
)


def _collection(resource: str, namespace: str | None) -> str:
    """The path of a collection named as the emulator's tests name it: "v1/pods", "batch/v1/jobs"."""
    *group_version, plural = resource.split("/")
    prefix = "/api/v1" if group_version == ["v1"] else "/apis/" + "/".join(group_version)
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


async def _events(stream: aiohttp.StreamReader) -> AsyncIterator[dict[str, Any]]:
    """A watch's events, one per line; split here, as a job's event may be longer than aiohttp's longest line."""
    pending = b""
    async for chunk in stream.iter_any():
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield json.loads(line)


class RealCluster(Cluster):
    """cluster.Cluster on the real API server."""

    def __init__(self, plane: ControlPlane, admission: KubeAdmission, tmp: Path) -> None:
        # Not Cluster.__init__: no emulator, no injected refusals.
        self.plane = plane
        self.admission = admission
        self.tmp = tmp
        self.kubeconfig = Path(plane.kubeconfig)
        self.operators = []
        self.audit = AuditLog(Path(plane.audit_log))
        self.context = ssl.create_default_context(cafile=plane.ca)
        self.context.load_cert_chain(plane.admin_cert, plane.admin_key)
        self.used_namespaces = {"default", OPERATOR_NAMESPACE}
        self.labelled: set[str] = set()  # namespaces the test labelled: their labels go at its end
        self.incarnations: dict[tuple[str, str], set[str]] = {}  # (namespace, pod name) -> the uids it had
        self.graces: dict[tuple[str, str], int] = {}  # (namespace, pod name) -> its deletion's grace period
        self.graced: set[str] = set()  # the pods (uids) whose deletion's grace is recorded
        self.held: set[tuple[str, str]] = set()  # pods whose termination the test kubelet does not confirm yet
        self.versions: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (namespace, job name) -> its versions

    # --- HTTP ---------------------------------------------------------------------------------------

    def _send(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.plane.url + path, data=data, method=method,
                                         headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=30) as reply:
                return reply.status, json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    async def _request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        self._note_namespace(path, body)
        status, data = await asyncio.to_thread(self._send, method, path, body, content_type)
        if status >= 300:
            raise AssertionError(f"{method} {path}: {status} {data}")
        return data

    def _get(self, path: str, query: dict[str, str] | None = None) -> Any:
        status, data = self._send("GET", path + ("?" + urllib.parse.urlencode(query) if query else ""))
        if status == 404:
            return None
        if status >= 300:
            raise AssertionError(f"GET {path}: {status} {data}")
        return data

    def _note_namespace(self, path: str, body: Any) -> None:
        """A namespace the test writes in: made ready for the operator's pods (its trainers' account)."""
        parts = path.split("/")
        namespace = parts[parts.index("namespaces") + 1] if "namespaces" in parts[:-1] else None
        if namespace and namespace not in self.used_namespaces:
            self.used_namespaces.add(namespace)
            self.prepare_namespace(namespace)

    def prepare_namespace(self, namespace: str) -> None:
        self.admission.namespace(namespace)
        account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TRAINER_ACCOUNT}}
        status, data = self._send("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", account)
        assert status in (201, 409), data

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A Namespace is made (or found: namespaces outlive a test) with the labels asked for, which last as
        long as the test."""
        if obj["kind"] != "Namespace":
            return await super().create(obj)
        name = obj["metadata"]["name"]
        self._note_namespace(f"/api/v1/namespaces/{name}/", None)
        self.labelled.add(name)
        return await self.patch(f"/api/v1/namespaces/{name}", {"metadata": {"labels": obj["metadata"].get("labels")}})

    # --- The operator ---------------------------------------------------------------------------------

    async def start_operator(self, *args: str, pod_id: str = "dtrain-operator-test"):
        """Start an operator and wait until it watches pods (its indexes are filling)."""
        process = self.operator(*args, pod_id=pod_id)
        watches = self.audit.requests_of(OPERATOR_AGENTS).count("watch pods")
        process.start()

        def watching() -> bool:
            if not process.running:
                raise AssertionError(f"the operator exited ({process.process.returncode}):\n{process.log_tail()}")
            return self.audit.requests_of(OPERATOR_AGENTS).count("watch pods") > watches

        await self.eventually(watching, "the operator never started watching pods", timeout=60)
        return process

    # --- What is stored ----------------------------------------------------------------------------

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(f"{_collection(f'{contract.API_VERSION}/{contract.PLURAL}', namespace)}/{name}")

    def objects(self, resource: str, namespace: str | None = None, job: str | None = None) -> list[dict[str, Any]]:
        query = {"labelSelector": f"{contract.LABEL_JOB_NAME}={job}"} if job is not None else None
        listed = self._get(_collection(resource, namespace), query)
        return [] if listed is None else listed["items"]

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod = self._get(f"{_collection('v1/pods', namespace)}/{name}")
        if pod is None:
            raise KeyError((namespace, name))
        return pod

    def pod_creations(self, namespace: str, name: str) -> int:
        return len(self.incarnations.get((namespace, name), ()))

    def job_versions(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return list(self.versions.get((namespace, name), ()))

    def deletion_grace(self, namespace: str, name: str) -> int | None:
        return self.graces.get((namespace, name))

    # --- The scheduler and the kubelet ---------------------------------------------------------------------

    async def bind(self, namespace: str, name: str, node: str) -> None:
        """What the scheduler does: a Binding (spec.nodeName cannot be patched on a real server)."""
        await self._request("POST", f"{_collection('v1/pods', namespace)}/{name}/binding", {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        })

    async def run(self, namespace: str, name: str, node: str | None = None) -> None:
        """Running, and bound to a node (unless it is, or a scheduling gate holds it). A scheduler binds before a
        kubelet runs the pod; here the binding follows, so that the operator sees the pod go from created to
        Running in one step, as on the emulator, and not Starting in between."""
        pod = self.pod(namespace, name)
        unbound = not pod["spec"].get("nodeName") and not pod["spec"].get("schedulingGates")
        await super().run(namespace, name, (node or NODE) if unbound else None)

    async def hold_termination(self, namespace: str, name: str) -> None:
        self.held.add((namespace, name))

    async def let_go(self, namespace: str, name: str) -> None:
        self.held.discard((namespace, name))
        await self._confirm_termination(namespace, name)

    async def _confirm_termination(self, namespace: str, name: str, uid: str | None = None) -> None:
        """The kubelet's last word on a deleted pod: a delete with no grace (of this incarnation)."""
        body = {"gracePeriodSeconds": 0, **({"preconditions": {"uid": uid}} if uid else {})}
        status, data = await asyncio.to_thread(self._send, "DELETE", f"{_collection('v1/pods', namespace)}/{name}", body)
        assert status in (200, 404, 409), (status, data)

    # --- Pods as they come and go -----------------------------------------------------------------------

    async def watch(self, path: str, on_event: Any) -> None:
        """Every event of a collection, from now on, to `on_event(type, object)`."""
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with aiohttp.ClientSession(self.plane.url, timeout=timeout) as session:
            version = ""
            while True:
                query = {"watch": "1", **({"resourceVersion": version} if version else {})}
                async with session.get(path, params=query, ssl=self.context) as response:
                    async for event in _events(response.content):
                        if event.get("type", "ERROR") == "ERROR":  # expired (or refused): from the current objects
                            version = ""
                            break
                        version = event["object"]["metadata"]["resourceVersion"]
                        await on_event(event["type"], event["object"])

    async def on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        """How often a pod of each name was created, each deletion's grace, and the kubelet's confirmation."""
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        self.incarnations.setdefault(key, set()).add(meta["uid"])
        if kind != "DELETED" and meta.get("deletionTimestamp"):
            if meta["uid"] not in self.graced:  # the deletion's own grace, not the kubelet's confirmation (0)
                self.graced.add(meta["uid"])
                self.graces[key] = meta.get("deletionGracePeriodSeconds", 0)
            if pod["spec"].get("nodeName") and key not in self.held:
                await self._confirm_termination(*key, uid=meta["uid"])

    async def on_job(self, kind: str, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        if kind != "DELETED":
            self.versions.setdefault((meta["namespace"], meta["name"]), []).append(job)

    def clean_up(self) -> None:
        """Delete what the test made, in every namespace it used; pods at once (no kubelet confirms here)."""
        for namespace in sorted(self.labelled):
            found = self._get(f"/api/v1/namespaces/{namespace}")
            found["metadata"]["labels"] = {"kubernetes.io/metadata.name": namespace}
            status, data = self._send("PUT", f"/api/v1/namespaces/{namespace}", found)
            assert status == 200, data
        for namespace in sorted(self.used_namespaces):
            dtrs = self.objects(f"{contract.API_VERSION}/{contract.PLURAL}", namespace)
            for job in dtrs:
                if job["metadata"].get("finalizers"):
                    self._send("PATCH", f"{_collection(f'{contract.API_VERSION}/{contract.PLURAL}', namespace)}/"
                               f"{job['metadata']['name']}", {"metadata": {"finalizers": None}},
                               "application/merge-patch+json")
            for prefix, plural in LEFTOVERS:
                query = {"pods": "?gracePeriodSeconds=0",
                         "configmaps": "?" + urllib.parse.urlencode({"fieldSelector": "metadata.name!=kube-root-ca.crt"}),
                         "serviceaccounts": "?" + urllib.parse.urlencode(
                             {"fieldSelector": f"metadata.name!=default,metadata.name!={TRAINER_ACCOUNT}"}),
                         }.get(plural, "")
                status, data = self._send("DELETE", f"{prefix}/namespaces/{namespace}/{plural}{query}")
                assert status in (200, 404), (plural, status, data)


@contextlib.asynccontextmanager
async def running_real_cluster(plane: ControlPlane, admission: KubeAdmission, tmp: Path) -> AsyncIterator[RealCluster]:
    cluster = RealCluster(plane, admission, tmp)
    for namespace in sorted(cluster.used_namespaces):
        cluster.prepare_namespace(namespace)
    watches = [asyncio.create_task(cluster.watch("/api/v1/pods", cluster.on_pod)),
               asyncio.create_task(cluster.watch(_collection(f"{contract.API_VERSION}/{contract.PLURAL}", None),
                                                 cluster.on_job))]
    try:
        yield cluster
    finally:
        await cluster.stop_operators()
        await asyncio.to_thread(cluster.clean_up)
        for watch in watches:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
