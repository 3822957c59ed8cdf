"""The e2e bench: the test API server over HTTPS on the node's bridge with the chart's RBAC, the
operator as a process with its service account's token, the kubelet and the Job controller, and
a `kubectl get dtr` printer. Runs inside the node network namespace (tests/e2e/__main__.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import aiohttp.test_utils
import kmock

from dtrain_operator.api import contract
from tests.chart.helm import helm_template
from tests.operator.apiserver import ApiServer
from tests.operator.authz import Authorizer, User
from tests.operator.cluster import Cluster, OperatorProcess

from . import network
from .kubelet import API_PORT, JobController, Kubelet
from .tls import Certificates

if TYPE_CHECKING:
    from typing_extensions import Self

RELEASE_NAMESPACE = "dtrain-system"
RBAC_KINDS = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def write_kubeconfig(path: Path, server: str, token: str, ca: Path) -> Path:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {{server: "{server}", certificate-authority: "{ca}"}}
users:
- name: dtrain-operator
  user: {{token: "{token}"}}
contexts:
- name: e2e
  context: {{cluster: e2e, user: dtrain-operator, namespace: {RELEASE_NAMESPACE}}}
current-context: e2e
"""
    )
    return path


class TlsServer(aiohttp.test_utils.RawTestServer):
    """aiohttp's test server, serving HTTPS (kmock starts it without TLS options)."""

    def __init__(self, *args: Any, ssl_context: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ssl_context = ssl_context

    async def start_server(self, loop: Any = None, **kwargs: Any) -> None:
        await super().start_server(loop=loop, ssl=self._ssl_context, **kwargs)


class E2ECluster(Cluster):
    """tests/operator/cluster.py's Cluster (kubectl, waits, the operator process) over HTTPS with tokens."""

    def __init__(self, api: ApiServer, tmp: Path, kubeconfig: Path) -> None:
        super().__init__(api, tmp)
        self.kubeconfig = kubeconfig


class Bench:
    """Everything a scenario needs; entered once for all scenarios."""

    def __init__(self, folder: Path, env_bin: Path) -> None:
        self.folder = folder
        self.env_bin = env_bin
        self.stack = contextlib.AsyncExitStack()
        self.printers: dict[str, list[tuple[float, list[str]]]] = {}
        self.quiet = False

    async def __aenter__(self) -> Self:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.certs = Certificates(self.folder / "pki", network.NODE_ADDRESS)
        chart = helm_template(namespace=RELEASE_NAMESPACE)
        self.chart = chart
        self.authz = Authorizer(obj for obj in chart if obj["kind"] in RBAC_KINDS)
        accounts = [o for o in chart if o["kind"] == "ServiceAccount"]
        operator_account = next(o for o in accounts if o["metadata"]["labels"].get("app.kubernetes.io/component") == "operator")
        self.trainer_account = next(o for o in accounts if o["metadata"]["labels"].get("app.kubernetes.io/component") == "trainer")
        self.operator_user = User.service_account(RELEASE_NAMESPACE, operator_account["metadata"]["name"])
        operator_token = self.authz.issue(self.operator_user)
        admin = self.authz.admin_token()
        self._tokens: dict[tuple[str, str], str] = {}

        client_context = self.certs.client_context()

        def client(url: Any) -> aiohttp.ClientSession:
            return aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(ssl=client_context),
                                         headers={"Authorization": f"Bearer {admin}"})

        self.api = await self.stack.enter_async_context(ApiServer(authorizer=self.authz))
        server_cls = functools.partial(TlsServer, ssl_context=self.certs.server_context())
        await self.stack.enter_async_context(
            kmock.Server(self.api, host=network.NODE_ADDRESS, port=API_PORT, server_cls=server_cls, client_fct=client)
        )
        self.api.declare_resources()
        self.url = f"https://{network.NODE_ADDRESS}:{API_PORT}"
        kubeconfig = write_kubeconfig(self.folder / "operator.kubeconfig", self.url, operator_token, self.certs.ca)
        self.cluster = E2ECluster(self.api, self.folder, kubeconfig)
        # kubectl apply meets the CRD's schema, defaults and CEL rules, as on a cluster.
        self.api.admission.append(self.cluster.crd_admission.hook)
        self.kubelet = await self.stack.enter_async_context(
            Kubelet(self.api, self.cluster._request, self.token_for, self.folder / "node", self.certs.ca, self.env_bin)
        )
        await self.stack.enter_async_context(JobController(self.api, self.cluster._request))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for process in self.cluster.operators:
            if process.running:
                process.stop()
        await self.stack.aclose()

    def token_for(self, namespace: str, account: str) -> str:
        """The token the kubelet mounts into a pod of this service account (one per account, as a projected token)."""
        key = (namespace, account)
        if key not in self._tokens:
            self._tokens[key] = self.authz.issue(User.service_account(namespace, account))
        return self._tokens[key]

    @property
    def trainer_user(self) -> str:
        return f"system:serviceaccount:{RELEASE_NAMESPACE}:{self.trainer_account['metadata']['name']}"

    # --- The operator -------------------------------------------------------------------------------

    async def start_operator(self) -> OperatorProcess:
        # As the chart's Deployment runs it: the leader-election Lease in the release namespace,
        # where the chart's Role for it is.
        return await self.cluster.start_operator(f"--leader-elect-resource-namespace={RELEASE_NAMESPACE}")

    @property
    def operator(self) -> OperatorProcess:
        return self.cluster.operators[-1]

    # --- kubectl get dtr -------------------------------------------------------------------------------

    def get_dtr_row(self, namespace: str, name: str) -> list[str] | None:
        job = self.cluster.job(namespace, name)
        if job is None:
            return None
        status = job.get("status") or {}
        progress = status.get("progress") or {}
        rate = progress.get("imagesPerSecond")
        return [
            name,
            str(status.get("phase") or ""),
            str(status.get("nodesReady") or ""),
            "" if progress.get("epoch") is None else str(progress["epoch"]),
            "" if rate is None else f"{rate:.1f}",
            str(status.get("restarts", "")),
        ]

    @contextlib.asynccontextmanager
    async def watching(self, namespace: str, name: str):
        """Print `kubectl get dtr -w` lines (the CRD's printer columns) while the block runs; keep them."""
        rows: list[tuple[float, list[str]]] = []
        self.printers[name] = rows
        start = time.monotonic()

        async def watch() -> None:
            last = None
            if not self.quiet:
                print(f"{'NAME':<16} {'PHASE':<15} {'NODES':<6} {'EPOCH':<6} {'IMG/S':<7} {'RESTARTS':<9} AGE", flush=True)
            while True:
                row = self.get_dtr_row(namespace, name)
                if row is not None and row != last:
                    last = row
                    rows.append((time.monotonic(), row))
                    if not self.quiet:
                        age = f"{time.monotonic() - start:.0f}s"
                        print(f"{row[0]:<16} {row[1]:<15} {row[2]:<6} {row[3]:<6} {row[4]:<7} {row[5]:<9} {age}", flush=True)
                await asyncio.sleep(0.1)

        task = asyncio.create_task(watch())
        try:
            yield rows
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- Objects --------------------------------------------------------------------------------------

    def worker_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self.cluster.pods(namespace, name)

    def all_running(self, namespace: str, name: str, nodes: int, generation: int | None = None) -> bool:
        pods = self.worker_pods(namespace, name)
        if generation is not None:
            pods = [p for p in pods if p["metadata"]["labels"].get(contract.LABEL_GANG_GENERATION) == str(generation)]
        return len(pods) == nodes and all((p.get("status") or {}).get("phase") == "Running" for p in pods)

    def trainer_patches(self, namespace: str, name: str) -> int:
        """Status patches of this job allowed for the trainer's service account (rank 0's progress reports)."""
        return sum(
            1
            for user, attributes in self.authz.allowed_requests
            if user == self.trainer_user and attributes.verb == "patch"
            and attributes.resource == f"{contract.PLURAL}/status" and attributes.name == name
            and attributes.namespace == namespace
        )
