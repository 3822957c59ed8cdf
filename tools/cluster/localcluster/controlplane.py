"""The control plane's four processes, with the flags kubeadm's static pods give them (trimmed to
one machine): each the upstream command, run as a role of tools/cluster/controlplane's binary."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import layout, pki, processes

GO_BUILD_FLAGS = [
    "-trimpath",
    # What upstream's hack/lib/version.sh stamps, so that `kubectl version` shows the real release.
    (
        "-ldflags=-s -w -X k8s.io/component-base/version.gitVersion={v} -X k8s.io/component-base/version.gitMajor=1 "
        "-X k8s.io/component-base/version.gitMinor={minor} -X k8s.io/component-base/version.gitTreeState=clean"
    ),
]
# Kubernetes' own gang scheduling (1.36 alpha): the Workload/PodGroup API and the scheduler's gang plugin.
FEATURE_GATES = "GenericWorkload=true,GangScheduling=true"
RUNTIME_CONFIG = "scheduling.k8s.io/v1alpha2=true"


MODULE = layout.REPO / "tools" / "cluster" / "controlplane"
# kube-apiserver's audit log (layout.AUDIT_LOG): one line per request (Metadata: who, verb, object), which is
# how the benchmarks count a controller's requests (its apiserver_request_total metric names no user). Not
# the kubelets' (their node and pod status, the same under every controller) nor Lease renewals.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  userGroups: [system:nodes]
- level: None
  resources: [{group: coordination.k8s.io, resources: [leases]}]
- level: Metadata
"""


def required_version(module: Path, package: str) -> str:
    """The release of `package` that the module's go.mod requires."""
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(package)} (v\S+)", (module / "go.mod").read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"{module / 'go.mod'} requires no {package}")
    return found.group(1)


def module_dir(module: Path, package: str) -> Path:
    """The pinned release's own files (CRDs, manifests), where Go's module cache holds them."""
    listed = subprocess.run(["go", "list", "-mod=readonly", "-m", "-f", "{{.Dir}}", package], cwd=module,
                            capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        raise RuntimeError(f"go list -m {package} in {module}: {listed.stderr.strip()}")
    return Path(listed.stdout.strip())


def module_stamp(module: Path, package: str, flags: Sequence[str]) -> str:
    """What a binary is built from: its module's files (the pins in go.mod and go.sum, its own Go files),
    the package and the build flags (a version stamped in)."""
    digest = hashlib.sha256()
    for name in ["go.mod", "go.sum", *sorted(p.name for p in module.glob("*.go"))]:
        digest.update((module / name).read_bytes())
    digest.update(json.dumps([package, *flags]).encode())
    return digest.hexdigest()


def build_from_module(
    module: Path, package: str, binary: Path, flags: Sequence[str], announce: str, env: Mapping[str, str] | None = None
) -> None:
    """`go build` of `package` from its Go module into `binary`, when missing or built from other files
    (a stamp beside it records what it was built from, `env` too); niced, as it takes both cores for minutes."""
    stamp_file = binary.with_name(f"{binary.name}.stamp")
    stamp = module_stamp(module, package, [*flags, *(f"{k}={v}" for k, v in sorted((env or {}).items()))])
    if binary.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return
    if shutil.which("go") is None:
        raise RuntimeError(f"Go is not installed: {binary.name} is built from its Go module with Go 1.26 or later")
    binary.parent.mkdir(parents=True, exist_ok=True)
    print(announce, flush=True)
    # -mod=readonly: go.mod and go.sum are the pin; a build never changes them.
    result = subprocess.run(
        ["nice", "-n", "10", "go", "build", "-mod=readonly", *flags, "-o", str(binary), package],
        cwd=module, check=False, env={**os.environ, **(env or {})},
    )
    if result.returncode != 0:
        raise RuntimeError(f"the Go build of {binary.name} failed (above); check that the Go module proxy is "
                           "reachable (go env GOPROXY) and that Go 1.26 is installed")
    stamp_file.write_text(stamp)


def build() -> None:
    """The control plane from its module (tools/cluster/controlplane), when missing or stale."""
    minor = layout.KUBERNETES_VERSION.split(".")[1]
    build_from_module(
        MODULE, ".", layout.CONTROLPLANE_BINARY,
        [f.format(v=layout.KUBERNETES_VERSION, minor=minor) for f in GO_BUILD_FLAGS],
        f"cluster: building Kubernetes {layout.KUBERNETES_VERSION} from its Go modules (the first build takes "
        "about 10 minutes on 2 cores; Go's caches make the next one fast)",
    )


def port_in_use(port: int, address: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((address, port)) == 0


def healthy(url: str, cert: tuple[str, str] | None = None) -> bool:
    context = ssl.create_default_context(cafile=str(pki.ca()[0]))
    if cert:
        context.load_cert_chain(*cert)
    try:
        with urllib.request.urlopen(url, context=context if url.startswith("https") else None, timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def _role(role: str) -> list[str]:
    return [str(layout.CONTROLPLANE_BINARY), role]


def start_etcd() -> None:
    url = f"http://127.0.0.1:{layout.ETCD_CLIENT_PORT}"
    processes.start("etcd", _role("etcd") + [
        "--name=dtrain-local", f"--data-dir={layout.ETCD_DATA}",
        f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
        f"--listen-peer-urls=http://127.0.0.1:{layout.ETCD_PEER_PORT}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{layout.ETCD_PEER_PORT}",
        f"--initial-cluster=dtrain-local=http://127.0.0.1:{layout.ETCD_PEER_PORT}",
        "--listen-metrics-urls=", "--log-level=warn",
    ])
    processes.wait_until(lambda: healthy(f"{url}/health"), "etcd's /health", 60, "etcd")


def start_apiserver() -> None:
    policy = layout.STATE / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    cert, key = pki.serving("apiserver", "kube-apiserver", [])
    kubelet_cert, kubelet_key = pki.client("apiserver-kubelet-client", "kube-apiserver-kubelet-client")
    ca_cert, _ = pki.ca()
    processes.start("kube-apiserver", _role("kube-apiserver") + [
        f"--etcd-servers=http://127.0.0.1:{layout.ETCD_CLIENT_PORT}",
        f"--advertise-address={layout.BRIDGE_ADDRESS}", "--bind-address=0.0.0.0",
        f"--secure-port={layout.APISERVER_PORT}",
        f"--tls-cert-file={cert}", f"--tls-private-key-file={key}",
        f"--client-ca-file={ca_cert}",
        f"--service-account-issuer={layout.SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={layout.PKI / 'service-account.pub'}",
        f"--service-account-signing-key-file={layout.PKI / 'service-account.key'}",
        f"--service-cluster-ip-range={layout.SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        # The default admission plugins (ServiceAccount, ValidatingAdmissionPolicy, ...), and NodeRestriction.
        "--enable-admission-plugins=NodeRestriction",
        f"--kubelet-client-certificate={kubelet_cert}", f"--kubelet-client-key={kubelet_key}",
        f"--kubelet-certificate-authority={ca_cert}",
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=false",
        # No kube-proxy here: webhooks (Kueue's) are reached at their Service's endpoints, not its ClusterIP.
        "--enable-aggregator-routing=true",
        f"--feature-gates={FEATURE_GATES}", f"--runtime-config={RUNTIME_CONFIG}",
        f"--audit-policy-file={policy}", f"--audit-log-path={layout.AUDIT_LOG}",
        "--audit-log-maxsize=2000",  # MB: one file for a whole run (bench/operator_scale.py's --large included)
        "--profiling=false", "--v=1",
    ])
    admin = pki.client("admin", "kubernetes-admin", "system:masters")
    processes.wait_until(
        lambda: healthy(f"{layout.APISERVER_URL}/readyz", (str(admin[0]), str(admin[1]))),
        "kube-apiserver's /readyz", 120, "kube-apiserver",
    )


def _component_kubeconfig(name: str, user: str) -> str:
    cert, key = pki.client(name, user)
    return str(pki.kubeconfig(layout.PKI / f"{name}.kubeconfig", user, cert, key))


def start_controller_manager(controllers: str = "*") -> None:
    """`controllers`: its --controllers (every one by default; the operator's tests run a few)."""
    kubeconfig = _component_kubeconfig("controller-manager", "system:kube-controller-manager")
    ca_cert, ca_key = pki.ca()
    processes.start("kube-controller-manager", _role("kube-controller-manager") + [
        f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        # Each controller acts as its own service account, so RBAC's bootstrap roles apply to each.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={layout.PKI / 'service-account.key'}",
        f"--root-ca-file={ca_cert}",
        f"--cluster-signing-cert-file={ca_cert}", f"--cluster-signing-key-file={ca_key}",
        f"--service-cluster-ip-range={layout.SERVICE_CIDR}",
        f"--controllers={controllers}", "--leader-elect=false", "--bind-address=127.0.0.1",
        f"--secure-port={layout.CONTROLLER_MANAGER_PORT}", f"--feature-gates={FEATURE_GATES}",
        "--profiling=false", "--v=1",
    ])


def start_scheduler() -> None:
    kubeconfig = _component_kubeconfig("scheduler", "system:kube-scheduler")
    processes.start("kube-scheduler", _role("kube-scheduler") + [
        f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1",
        f"--secure-port={layout.SCHEDULER_PORT}", f"--feature-gates={FEATURE_GATES}", "--profiling=false", "--v=1",
    ])


COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
