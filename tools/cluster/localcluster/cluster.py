"""What the local cluster's commands share (`python -m localcluster`, __main__.py): the tools, names and
per-node defaults, its error, kubectl, the ports a command needs, cluster.json and the nodes' kubelets."""


from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from . import controlplane, layout, processes

HELM = layout.REPO / ".tools" / "bin" / "helm"
KUBECTL = layout.REPO / ".tools" / "bin" / "kubectl"
OPERATOR_NAMESPACE = "dtrain-system"
RELEASE = "dtrain"
S3_GATEWAY = "s3-gateway"
# What each node gets unless `up` is told otherwise (and what `join` assumes of a cluster whose
# cluster.json predates cpuPerNode and memoryPerNode).
DEFAULT_CPU = "4"
DEFAULT_MEMORY = "16Gi"
KUBELET_PREFIX = "kubelet-"


class ClusterError(RuntimeError):
    """One line that names the cause and the fix."""


def kubectl(*args: str, check: bool = True, capture: bool = True,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(KUBECTL), f"--kubeconfig={layout.KUBECONFIG}", *args], text=True, input=stdin,
                            capture_output=capture, check=False, timeout=300)
    if check and result.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)}: {(result.stderr or result.stdout).strip()}")
    return result


def _kubelet_name(index: int) -> str:
    return f"{KUBELET_PREFIX}{layout.Node(index).name}"


def ports_needed(nodes: list[layout.Node], control_plane: bool = True,
                 second_schedulers: Sequence[str] = ()) -> dict[int, str]:
    """The ports `up` (control_plane, second_schedulers) or `join` (the new node's alone) listens on, with who
    needs each."""
    ports = {layout.ETCD_CLIENT_PORT: "etcd", layout.ETCD_PEER_PORT: "etcd (peers)",
             layout.APISERVER_PORT: "kube-apiserver", layout.CONTROLLER_MANAGER_PORT: "kube-controller-manager",
             layout.SCHEDULER_PORT: "kube-scheduler", layout.S3_PORT: "the S3 gateway"} if control_plane else {}
    if "coscheduling" in second_schedulers:
        ports[layout.COSCHEDULING_PORT] = "the coscheduling scheduler"
    ports.update({node.kubelet_port: f"the kubelet of {node.name}" for node in nodes})
    return ports


def _check_ports(ports: dict[int, str], again: str = "make cluster") -> None:
    for port, what in ports.items():
        if controlplane.port_in_use(port):
            raise ClusterError(f"port {port}, which {what} needs, is in use by another program: stop it "
                               f"(ss -ltnp 'sport = :{port}' names it), then run {again} again")


def cluster_config(nodes: int, gpus: int, cpu: str, memory: str, pods_from: str,
                   second_schedulers: Sequence[str] = ()) -> dict[str, Any]:
    """cluster.json: what `up` was asked for, which `join` gives the next node too."""
    return {"nodes": nodes, "gpusPerNode": gpus, "cpuPerNode": cpu, "memoryPerNode": memory, "podsFrom": pods_from,
            "schedulers": list(second_schedulers)}


def next_node(config: dict[str, Any], process_names: list[str]) -> layout.Node:
    """The node `join` adds: after the highest one cluster.json counts or a kubelet's pid file names."""
    highest = int(config.get("nodes") or 0)
    for name in process_names:
        index = name.removeprefix(f"{KUBELET_PREFIX}node-")
        if name.startswith(KUBELET_PREFIX) and index.isdigit():
            highest = max(highest, int(index))
    return layout.Node(highest + 1)


def kubelet_argv(node: layout.Node, config: dict[str, Any]) -> list[str]:
    """One node's kubelet, with the per-node resources cluster.json records (`up`'s defaults where it has none)."""
    return [sys.executable, "-m", "localcluster", "kubelet", f"--node={node.index}",
            f"--cpu={config.get('cpuPerNode') or DEFAULT_CPU}", f"--memory={config.get('memoryPerNode') or DEFAULT_MEMORY}",
            f"--gpus={int(config.get('gpusPerNode') or 0)}", f"--pods-from={config.get('podsFrom') or 'images'}"]


def ready_nodes(nodes: list[dict[str, Any]]) -> set[str]:
    """The names of the Nodes (kubectl get nodes' items) that are Ready and no longer tainted not-ready."""
    def ready(node: dict[str, Any]) -> bool:
        conditions = node.get("status", {}).get("conditions", [])
        taints = node.get("spec", {}).get("taints") or []
        return (any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
                and not any(t["key"] == "node.kubernetes.io/not-ready" for t in taints))
    return {node["metadata"]["name"] for node in nodes if ready(node)}


def _ready_node_names() -> set[str]:
    result = kubectl("get", "nodes", "-o", "json", check=False)
    return ready_nodes(json.loads(result.stdout)["items"]) if result.returncode == 0 else set()


def _wait_nodes_ready(count: int) -> None:
    processes.wait_until(lambda: len(_ready_node_names()) >= count, f"{count} Ready nodes", 120)


def _start_kubelet(node: layout.Node, config: dict[str, Any]) -> None:
    node.folder.mkdir(parents=True, exist_ok=True)
    processes.start(_kubelet_name(node.index), kubelet_argv(node, config),
                    env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
                    cwd=layout.REPO / "tools" / "cluster")
