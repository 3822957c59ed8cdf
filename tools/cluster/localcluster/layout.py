"""Where the local cluster keeps its files, which addresses and ports it uses: one place for each."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
STATE = Path(os.environ.get("DTRAIN_CLUSTER_DIR", REPO / ".cluster"))
# A throwaway state directory (a benchmark's control plane) can keep using the one built binary.
BIN = Path(os.environ.get("DTRAIN_CLUSTER_BIN", STATE / "bin"))
CONTROLPLANE_BINARY = BIN / "controlplane"
PKI = STATE / "pki"
LOGS = STATE / "logs"
AUDIT_LOG = LOGS / "audit.log"  # kube-apiserver's (controlplane.AUDIT_POLICY)
RUN = STATE / "run"  # one pid file per process
ETCD_DATA = STATE / "etcd"
NODES = STATE / "nodes"  # one folder per node: its pods, volumes, kubelet credentials
VOLUMES = STATE / "volumes"  # the folders behind hostPath PersistentVolumes (shared by every node)
KUBECONFIG = STATE / "kubeconfig"
OBJECTS = STATE / "objects"  # the S3 gateway's buckets, one folder each
S3_KEYS = STATE / "s3-keys.json"  # the gateway's root keys, made at `up` (mode 0600)
CONFIG = STATE / "cluster.json"  # what `up` was asked for (nodes, GPUs), read by `status` and the kubelets

KUBERNETES_VERSION = "v1.36.3"
# Where `make images` puts dtrain's images (its default REGISTRY), tagged with the package's version.
IMAGE_REGISTRY = "localhost/dtrain"


def version() -> str:
    """The package's version: the images' tag."""
    return (REPO / "pyproject.toml").read_text().split('version = "', 1)[1].split('"', 1)[0]

# The pods' network: a bridge in the machine's own network namespace, with the API server's address
# on it; node i's pods get addresses in 10.250.i.0/24, all on the one /16. No route leaves it.
BRIDGE = "dtrain0"
NETWORK = "10.250.0.0/16"
BRIDGE_ADDRESS = "10.250.0.1"
NETNS_PREFIX = "dtrain-c-"
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
CLUSTER_DOMAIN = "cluster.local"



def _port(name: str, default: int) -> int:
    return int(os.environ.get(f"DTRAIN_{name}", default))


# Overridable (DTRAIN_ETCD_CLIENT_PORT, ...; DTRAIN_APISERVER_HOST for the URL, e.g. 127.0.0.1 when no
# bridge is set up) so that a second control plane, with its own DTRAIN_CLUSTER_DIR, can run beside
# `make cluster` (bench/operator_scale.py starts etcd and kube-apiserver so). Read at import, as STATE is.
ETCD_CLIENT_PORT = _port("ETCD_CLIENT_PORT", 2379)
ETCD_PEER_PORT = _port("ETCD_PEER_PORT", 2380)
APISERVER_PORT = _port("APISERVER_PORT", 6443)
CONTROLLER_MANAGER_PORT = _port("CONTROLLER_MANAGER_PORT", 10257)
SCHEDULER_PORT = _port("SCHEDULER_PORT", 10259)
# scheduler-plugins' coscheduling scheduler (make cluster SCHEDULERS=coscheduling), beside kube-scheduler.
COSCHEDULING_PORT = _port("COSCHEDULING_PORT", 10269)
CONTROL_PLANE_PORTS = frozenset({CONTROLLER_MANAGER_PORT, SCHEDULER_PORT, COSCHEDULING_PORT})
KUBELET_FIRST_PORT = 10250  # node i serves its pods' logs on the i-th port from here that is not the control plane's
S3_PORT = _port("S3_PORT", 9000)

APISERVER_URL = f"https://{os.environ.get('DTRAIN_APISERVER_HOST', BRIDGE_ADDRESS)}:{APISERVER_PORT}"
SERVICE_ACCOUNT_ISSUER = f"https://kubernetes.default.svc.{CLUSTER_DOMAIN}"

# The user namespace `up` prepares for jobs, as a platform team prepares a team's: the trainers' service
# account (the chart's), the S3 Secret and a ReadWriteMany claim. No job runs in the operator's namespace.
JOB_NAMESPACE = "team-a"
SHARED_CLAIM = "dtrain-shared"
SHARED_CLAIM_SIZE = "10Gi"

# Object storage for spec.storage.url: an S3 gateway on the bridge, one bucket, and its keys in a Secret
# of that name in the jobs' namespace (the Secret's keys are the SDK's variables).
S3_ENDPOINT = f"http://{BRIDGE_ADDRESS}:{S3_PORT}"
S3_BUCKET = "dtrain"
S3_SECRET = "dtrain-s3"


@dataclass(frozen=True)
class Node:
    """One node of the cluster: its name, its index (1-based), its pods' subnet and its kubelet port."""

    index: int

    @property
    def name(self) -> str:
        return f"node-{self.index}"

    @property
    def subnet(self) -> str:
        return f"10.250.{self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"{self.subnet}.0/24"

    @property
    def kubelet_port(self) -> int:
        # The control plane's own ports lie in the kubelets' range (10257, 10259): node 8 and later step over them.
        free = (port for port in range(KUBELET_FIRST_PORT, 65536) if port not in CONTROL_PLANE_PORTS)
        return next(port for i, port in enumerate(free, start=1) if i == self.index)

    @property
    def folder(self) -> Path:
        return NODES / self.name
