"""The kubelet's Node: registered with its capacity, its status and its Lease in kube-node-lease kept fresh."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from datetime import datetime, timezone
from typing import Any

from . import layout
from .api import Api, ApiError
from .podrun import now

log = logging.getLogger("localcluster.kubelet")

HEARTBEAT_SECONDS = 10

LEASE_SECONDS = 40


def node_status(node: layout.Node, capacity: dict[str, str]) -> dict[str, Any]:
    """The Node's status: its capacity (all of it allocatable), Ready, no pressure, its addresses."""
    stamp = now()
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "dtrain local kubelet is ready",
             "lastHeartbeatTime": stamp}
    pressure = [{"type": t, "status": "False", "reason": f"KubeletHasNo{t}", "lastHeartbeatTime": stamp}
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure")]
    return {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [ready, *pressure],
        "addresses": [{"type": "InternalIP", "address": layout.BRIDGE_ADDRESS},
                      {"type": "Hostname", "address": node.name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": node.kubelet_port}},
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": os.uname().release,
            "osImage": "dtrain local kubelet (processes in namespaces)", "containerRuntimeVersion": "namespaces://0",
            "kubeletVersion": layout.KUBERNETES_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


async def register(api: Api, node: layout.Node, capacity: dict[str, str]) -> None:
    """The Node made (or found) and its status written."""
    registered = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node.name, "labels": {
            "kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "dtrain-local",
        }},
        "spec": {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr]},
    }
    with contextlib.suppress(ApiError):
        await api.request("POST", "/api/v1/nodes", registered)
    await api.patch(f"/api/v1/nodes/{node.name}/status", {"status": node_status(node, capacity)}, "strategic")


async def heartbeat(api: Api, node: layout.Node, capacity: dict[str, str]) -> None:
    """The node's Lease in kube-node-lease and its status, renewed every HEARTBEAT_SECONDS."""
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node.name}"
    while True:
        micro = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": node.name, "namespace": "kube-node-lease"},
                 "spec": {"holderIdentity": node.name, "leaseDurationSeconds": LEASE_SECONDS,
                          "renewTime": micro}}
        try:
            try:
                await api.patch(lease_path, {"spec": lease["spec"]})
            except ApiError as exc:
                if exc.status != 404:
                    raise
                await api.request("POST", lease_path.rsplit("/", 1)[0], lease)
            await api.patch(f"/api/v1/nodes/{node.name}/status", {"status": node_status(node, capacity)},
                                 "strategic")
        except ApiError as exc:
            log.warning("heartbeat: %s", exc)
        await asyncio.sleep(HEARTBEAT_SECONDS)
