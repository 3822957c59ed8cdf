"""`python -m localcluster join`'s rules, without a cluster or root: which node joins, with what, on
which port, when it counts as Ready, and that only its own certificates are made."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from localcluster import layout, pki
from localcluster.cluster import (
    DEFAULT_CPU,
    DEFAULT_MEMORY,
    cluster_config,
    kubelet_argv,
    next_node,
    ports_needed,
    ready_nodes,
)

UP = cluster_config(2, 1, "2", "8Gi", "images")


@pytest.mark.parametrize(
    "config,names,index",
    [
        (UP, ["etcd", "kube-apiserver", "kubelet-node-1", "kubelet-node-2", "s3-gateway"], 3),
        (UP, [], 3),  # the count cluster.json keeps
        (UP, ["kubelet-node-1", "kubelet-node-2", "kubelet-node-3"], 4),  # a kubelet cluster.json does not count yet
        ({**UP, "nodes": 3}, ["kubelet-node-1", "kubelet-node-2"], 4),
        ({}, ["kubelet-node-1", "kubelet-nodeX"], 2),
    ],
)
def test_the_next_node_follows_the_highest_known_one(config, names, index):
    assert next_node(config, names) == layout.Node(index)


def test_the_joining_kubelet_gets_what_up_gave_each_node():
    argv = kubelet_argv(layout.Node(3), UP)
    assert argv[2:] == ["localcluster", "kubelet", "--node=3", "--cpu=2", "--memory=8Gi", "--gpus=1",
                        "--pods-from=images"]


def test_a_cluster_json_from_before_the_per_node_resources_gets_ups_defaults():
    argv = kubelet_argv(layout.Node(3), {"nodes": 2, "gpusPerNode": 0, "podsFrom": "host"})
    assert argv[4:] == ["--node=3", f"--cpu={DEFAULT_CPU}", f"--memory={DEFAULT_MEMORY}", "--gpus=0", "--pods-from=host"]


def test_join_checks_only_the_new_kubelets_port():
    node = layout.Node(3)
    assert ports_needed([node], control_plane=False) == {layout.KUBELET_FIRST_PORT + 2: "the kubelet of node-3"}
    everything = ports_needed([layout.Node(1), layout.Node(2)])
    assert {layout.APISERVER_PORT, layout.ETCD_CLIENT_PORT, layout.KUBELET_FIRST_PORT,
            layout.KUBELET_FIRST_PORT + 1} <= set(everything)


def node(name: str, ready: str = "True", taints: list[str] = ()) -> dict:
    return {"metadata": {"name": name}, "spec": {"taints": [{"key": t, "effect": "NoSchedule"} for t in taints]},
            "status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}]}}


def test_a_node_is_ready_once_ready_and_no_longer_tainted_not_ready():
    nodes = [node("node-1"), node("node-2", taints=["dtrain.dev/e2e"]), node("node-3", ready="False"),
             node("node-4", taints=["node.kubernetes.io/not-ready"]), {"metadata": {"name": "node-5"}}]
    assert ready_nodes(nodes) == {"node-1", "node-2"}


def test_a_node_without_the_clusters_ca_is_refused(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(layout, "PKI", tmp_path)
    with pytest.raises(pki.PkiError, match="make cluster starts a cluster first"):
        pki.make_node(layout.Node(3))
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the certificates")
def test_a_joining_node_makes_its_own_certificates_and_nothing_else(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(layout, "PKI", tmp_path)
    ca_cert, ca_key = pki.ca()
    pki._openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
                 "-keyout", str(ca_key), "-out", str(ca_cert))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    pki.make_node(layout.Node(3))
    made = {p.name for p in tmp_path.iterdir()} - set(before)
    assert made - {"ca.srl"} == {"node-3-client.crt", "node-3-client.key", "node-3-serving.crt", "node-3-serving.key"}
    assert all((tmp_path / name).read_bytes() == text for name, text in before.items())


def test_no_node_serves_on_a_port_of_the_control_plane():
    ports = [layout.Node(i).kubelet_port for i in range(1, 30)]
    assert ports[:7] == list(range(10250, 10257))
    assert len(set(ports)) == len(ports) and not set(ports) & layout.CONTROL_PLANE_PORTS
