"""`python -m localcluster join`, `lose` and `rejoin`: a node added to, lost from and brought back to the
running cluster."""


from __future__ import annotations

import argparse
import json
import time

from . import layout, pki, processes
from .cluster import (
    KUBECTL,
    ClusterError,
    _check_ports,
    _kubelet_name,
    _ready_node_names,
    _start_kubelet,
    kubectl,
    kubelet_argv,
    next_node,
    ports_needed,
)


def join(_: argparse.Namespace) -> int:
    """One more node in the running cluster: its certificates alone (the CA's, signed; nothing else is made
    again), its kubelet with the per-node resources of `up`, cluster.json's count; returns when it is Ready."""
    if not processes.running("kube-apiserver") or not layout.CONFIG.exists():
        raise ClusterError("no cluster runs here: make cluster starts one, then make cluster-join adds a node")
    if not KUBECTL.exists():
        raise ClusterError(f"{KUBECTL} is missing: run make tools")
    config = json.loads(layout.CONFIG.read_text())
    node = next_node(config, processes.names())
    _check_ports(ports_needed([node], control_plane=False), "make cluster-join")
    started = time.monotonic()
    pki.make_node(node)
    argv = kubelet_argv(node, config)
    print(f"cluster: starting the kubelet of {node.name} ({' '.join(argv[4:])})", flush=True)
    _start_kubelet(node, config)
    config["nodes"] = node.index
    layout.CONFIG.write_text(json.dumps(config))
    processes.wait_until(lambda: node.name in _ready_node_names(), f"{node.name} Ready", 120,
                         process=_kubelet_name(node.index))
    print(f"cluster: {node.name} joined and is Ready in {time.monotonic() - started:.0f} s; "
          f"{len(_ready_node_names())} Ready nodes")
    return 0


def _node_named(name: str) -> layout.Node:
    index = name.removeprefix("node-")
    if not index.isdigit() or int(index) < 1:
        raise ClusterError(f"{name!r} is not a node of this cluster (node-1, node-2, ...)")
    return layout.Node(int(index))


def lose(args: argparse.Namespace) -> int:
    """A node lost, as a machine is: its kubelet stopped (every process of its pods ends with it) and its Node
    object deleted, so that the pod garbage collector deletes the pods bound to it (about 40 s later)."""
    node = _node_named(args.node)
    if not processes.running(_kubelet_name(node.index)):
        raise ClusterError(f"{node.name} has no kubelet running here (make cluster-status lists the nodes)")
    processes.stop(_kubelet_name(node.index))
    kubectl("delete", "node", node.name, "--wait=false")
    print(f"cluster: {node.name} lost: its kubelet stopped and its Node deleted; `rejoin {node.name}` brings it back")
    return 0


def rejoin(args: argparse.Namespace) -> int:
    """A lost node back: its kubelet started again (its certificates kept), which registers the Node anew;
    returns when it is Ready."""
    node = _node_named(args.node)
    if not processes.running("kube-apiserver") or not layout.CONFIG.exists():
        raise ClusterError("no cluster runs here: make cluster starts one")
    if processes.running(_kubelet_name(node.index)):
        raise ClusterError(f"{node.name}'s kubelet runs already")
    if not node.folder.exists():
        raise ClusterError(f"{node.name} was never part of this cluster: make cluster-join adds a node")
    _start_kubelet(node, json.loads(layout.CONFIG.read_text()))
    processes.wait_until(lambda: node.name in _ready_node_names(), f"{node.name} Ready", 120,
                         process=_kubelet_name(node.index))
    print(f"cluster: {node.name} is back and Ready")
    return 0
