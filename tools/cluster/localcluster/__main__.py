"""`python -m localcluster up|join|down|status` (from tools/cluster; make cluster, cluster-join, cluster-down).

    up [--nodes N] [--gpus-per-node G]   build what is missing, start the control plane, N kubelets, an S3
       [--schedulers coscheduling]       gateway for spec.storage.url and the operator (helm install), the
       [--kueue]                         second schedulers named (schedulers.py) and Kueue when asked
                                         (kueue.py); return when the operator is Available
    join                                 one more node in the running cluster (the next index, with the CPU,
                                         memory and GPUs each node got at `up`); return when it is Ready
    down                                 stop everything `up` started and remove its state
    status                               what runs
    volume NAME [-n NAMESPACE]           a ReadWriteMany claim for spec.storage.claimName
    kueue                                Kueue in the running cluster (built the first time)
    anchors                              JobSet, Kubeflow Trainer and the Training Operator in the running
                                         cluster (anchors.py; built the first time), for make bench-anchors
    build [--schedulers S] [--kueue] [--anchors]
                                         the binaries `up` runs (Go builds), nothing started
    kubelet --node I ...                 one node's kubelet (started by `up`)
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import anchors, controlplane, kueue, layout, network, objectstore, pki, processes, schedulers

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


def _prerequisites() -> None:
    try:
        network.probe()
    except network.NetworkError as exc:
        raise ClusterError(str(exc)) from exc
    for tool in (HELM, KUBECTL):
        if not tool.exists():
            raise ClusterError(f"{tool} is missing: run make tools")


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


def _build_images() -> None:
    """The images the pods run from, in this machine's containers-storage (their unchanged layers reused)."""
    print("cluster: building the operator, trainer and engine images (tools/build-local-images.sh; the first "
          "build takes several minutes, then unchanged layers are reused)", flush=True)
    result = subprocess.run(["bash", str(layout.REPO / "tools" / "build-local-images.sh")], check=False,
                            env={**os.environ, "REGISTRY": layout.IMAGE_REGISTRY, "VERSION": layout.version()})
    if result.returncode != 0:
        raise ClusterError("the image build failed (above); make cluster PODS_FROM=host runs the pods from this "
                           "machine's environment instead")


def _start_object_store() -> dict[str, str]:
    """The pods' S3 gateway on the bridge with its bucket; returns its root keys (also in layout.S3_KEYS)."""
    try:
        objectstore.build()
    except subprocess.CalledProcessError as exc:
        raise ClusterError("the S3 gateway's build failed (above): bash tools/s3server/build.sh shows why") from exc
    keys = {"AWS_ACCESS_KEY_ID": "dtrain" + secrets.token_hex(6), "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(24)}
    layout.S3_KEYS.touch(mode=0o600)
    layout.S3_KEYS.write_text(json.dumps(keys))
    layout.OBJECTS.mkdir(parents=True, exist_ok=True)
    processes.start(S3_GATEWAY, objectstore.gateway_argv(f"{layout.BRIDGE_ADDRESS}:{layout.S3_PORT}", layout.OBJECTS),
                    env=objectstore.gateway_env(keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"]))
    objectstore.wait_until_answering(layout.S3_ENDPOINT, lambda: processes.running(S3_GATEWAY) is not None, 60,
                                     lambda: processes.tail(S3_GATEWAY))
    objectstore.create_bucket(layout.S3_ENDPOINT, keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"], layout.S3_BUCKET)
    return keys


def object_store_secrets(keys: dict[str, str]) -> str:
    """The jobs' namespace, and in it the gateway's keys as the Secret spec.storage.credentialsSecret names."""
    namespace = layout.JOB_NAMESPACE
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": {"name": layout.S3_SECRET, "namespace": namespace}, "stringData": keys},
    ]})


def _start_coscheduling() -> None:
    """scheduler-plugins' PodGroup CRD (from its module's own files), read access to PodGroups for the
    scheduler's credentials, then the scheduler itself."""
    print(f"cluster: starting scheduler-plugins' coscheduling scheduler (schedulerName: {schedulers.SCHEDULER_NAME}) "
          f"with its PodGroup CRD", flush=True)
    kubectl("apply", "-f", str(schedulers.crd_file()))
    kubectl("wait", "--for=condition=Established", f"crd/{schedulers.CRD}", "--timeout=60s")
    kubectl("apply", "-f", "-", stdin=json.dumps(schedulers.rbac()))
    schedulers.start()


def job_defaults() -> dict[str, Any]:
    """The chart's jobDefaults for this cluster, as a platform team sets them once: the images built here, the
    engine's ONNX Runtime fallback on a CPU's share (no TensorRT, no GPU it could use), and the jobs' namespace's
    claim; so that examples/quickstart.yaml, unchanged, runs there."""
    return {"jobDefaults": {
        "spec": {"image": f"{layout.IMAGE_REGISTRY}/dtrain-trainer:{layout.version()}",
                 "engine": {"image": f"{layout.IMAGE_REGISTRY}/dtrain-engine:{layout.version()}",
                            "fallback": "onnxruntime", "resources": {"limits": {"cpu": "1", "memory": "4Gi"}}}},
        "namespaces": {layout.JOB_NAMESPACE: {"storage": {"claimName": layout.SHARED_CLAIM}}},
    }}


def _install_operator() -> None:
    values = layout.STATE / "operator-values.json"
    values.write_text(json.dumps(job_defaults()))
    command = [str(HELM), f"--kubeconfig={layout.KUBECONFIG}", "upgrade", "--install", RELEASE,
               str(layout.REPO / "helm" / "dtrain-operator"), "-n", OPERATOR_NAMESPACE, "--create-namespace",
               "-f", str(values),
               "--set", f"image.repository={layout.IMAGE_REGISTRY}/dtrain-operator", "--set", f"image.tag={layout.version()}",
               "--set", "image.pullPolicy=Never",
               # The trainers' service account where the README's jobs go.
               "--set", f"trainerServiceAccount.namespaces={{{layout.JOB_NAMESPACE}}}", "--wait", "--timeout=5m"]
    result = subprocess.run(command, text=True, capture_output=True, check=False, timeout=400)
    if result.returncode != 0:
        raise ClusterError(f"helm install of the operator failed: {result.stderr.strip()} "
                           f"(kubectl -n {OPERATOR_NAMESPACE} describe pods; logs under {layout.LOGS})")


def up(args: argparse.Namespace) -> int:
    if processes.running("kube-apiserver"):
        print(f"cluster: already running ({', '.join(n for n in processes.names() if processes.running(n))})")
        if args.schedulers and not processes.running(schedulers.PROCESS):
            raise ClusterError(f"the running cluster has no {', '.join(args.schedulers)} scheduler: make cluster-down, "
                               f"then make cluster SCHEDULERS={','.join(args.schedulers)}")
        print(f"export KUBECONFIG={layout.KUBECONFIG}")
        return 0
    nodes = [layout.Node(i) for i in range(1, args.nodes + 1)]
    _prerequisites()
    _check_ports(ports_needed(nodes, second_schedulers=args.schedulers))
    started = time.monotonic()
    controlplane.build()
    if "coscheduling" in args.schedulers:
        schedulers.build()
    if args.pods_from == "images":
        _build_images()
    layout.STATE.mkdir(parents=True, exist_ok=True)
    config = cluster_config(args.nodes, args.gpus_per_node, args.cpu_per_node, args.memory_per_node, args.pods_from,
                            args.schedulers)
    layout.CONFIG.write_text(json.dumps(config))
    pki.make_all(nodes)
    admin = pki.client("admin", "kubernetes-admin", "system:masters")
    pki.kubeconfig(layout.KUBECONFIG, "kubernetes-admin", *admin)
    network.setup_bridge()
    print(f"cluster: starting the S3 gateway on {layout.S3_ENDPOINT} (bucket {layout.S3_BUCKET})", flush=True)
    s3_keys = _start_object_store()
    print("cluster: starting etcd and kube-apiserver", flush=True)
    controlplane.start_etcd()
    controlplane.start_apiserver()
    kubectl("apply", "-f", str(layout.REPO / "tools" / "cluster" / "manifests" / "kubelet-hosts.yaml"))
    # On stdin, not in argv: the keys stay out of the process list.
    subprocess.run([str(KUBECTL), f"--kubeconfig={layout.KUBECONFIG}", "apply", "-f", "-"], check=True, timeout=120,
                   input=object_store_secrets(s3_keys), text=True, capture_output=True)
    controlplane.start_controller_manager()
    controlplane.start_scheduler()
    if "coscheduling" in args.schedulers:
        _start_coscheduling()
    print(f"cluster: starting {len(nodes)} kubelets", flush=True)
    for node in nodes:
        _start_kubelet(node, config)
    _wait_nodes_ready(len(nodes))
    if not args.no_operator:
        print("cluster: helm install dtrain helm/dtrain-operator -n dtrain-system --create-namespace", flush=True)
        _install_operator()
    if make_volume(layout.SHARED_CLAIM, layout.JOB_NAMESPACE, layout.SHARED_CLAIM_SIZE) != 0:
        raise ClusterError(f"the claim {layout.JOB_NAMESPACE}/{layout.SHARED_CLAIM} could not be made (above)")
    if args.kueue:
        _start_kueue()
    server = kubectl("version", "-o", "json").stdout
    version = json.loads(server)["serverVersion"]["gitVersion"]
    also = "".join(f", {name}" for name in args.schedulers)
    print(f"cluster: Kubernetes {version} with {len(nodes)} nodes (pods from {args.pods_from}{also}) is up in "
          f"{time.monotonic() - started:.0f} s; the operator is {'Available' if not args.no_operator else 'not installed'}")
    print(f"cluster: jobs go to namespace {layout.JOB_NAMESPACE}: its trainer service account, the ReadWriteMany "
          f"claim {layout.SHARED_CLAIM} (spec.storage.claimName) and object storage: spec.storage {{url: "
          f"s3://{layout.S3_BUCKET}/<prefix>, s3: {{endpoint: {layout.S3_ENDPOINT}}}, credentialsSecret: {layout.S3_SECRET}}}")
    print(f"export KUBECONFIG={layout.KUBECONFIG}")
    return 0


def _start_kueue() -> None:
    """Kueue's manager built and installed from its module's own files (kueue.py); returns when its webhooks answer."""
    kueue.build()
    kueue.build_image()
    print(f"cluster: installing Kueue {kueue.version()} (its config/default) in {kueue.NAMESPACE}", flush=True)
    kueue.install(kubectl)
    print(f"cluster: Kueue {kueue.version()} is up: a DistributedTraining labelled kueue.x-k8s.io/queue-name is "
          "queued as one pod group", flush=True)


def build(args: argparse.Namespace) -> int:
    """The cluster's binaries from their Go modules, nothing started (CI builds them beside make test)."""
    controlplane.build()
    if "coscheduling" in args.schedulers:
        schedulers.build()
    if args.kueue:
        kueue.build()
    if args.anchors:
        for anchor in anchors.ANCHORS:
            anchors.build(anchor)
    return 0


def start_kueue(_: argparse.Namespace) -> int:
    """Kueue in the running cluster (`make cluster KUEUE=1` does it at `up`); nothing when it answers already."""
    if not processes.running("kube-apiserver"):
        raise ClusterError("no cluster runs here: make cluster KUEUE=1 starts one with Kueue")
    _start_kueue()
    return 0


def start_anchors(_: argparse.Namespace) -> int:
    """The anchors' controllers in the running cluster, each built and installed from its module (anchors.py);
    nothing for one whose webhooks answer already."""
    if not processes.running("kube-apiserver"):
        raise ClusterError("no cluster runs here: make cluster starts one")
    for anchor in anchors.ANCHORS:
        anchors.install(anchor, kubectl)
    print(f"cluster: {', '.join(f'{a.title} {a.version()}' for a in anchors.ANCHORS)} are up", flush=True)
    return 0


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


def volume_manifest(name: str, namespace: str, size: str) -> str:
    """A ReadWriteMany claim bound to a hostPath PersistentVolume of its own (there is no provisioner)."""
    folder = layout.VOLUMES / namespace / name
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{namespace}-{name}"},
         "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteMany"], "storageClassName": "local",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"},
                  "claimRef": {"namespace": namespace, "name": name}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "local", "volumeName": f"{namespace}-{name}",
                  "resources": {"requests": {"storage": size}}}},
    ]})


def make_volume(name: str, namespace: str, size: str) -> int:
    """A shared claim for spec.storage, as a ReadWriteMany storage class would give one."""
    folder = layout.VOLUMES / namespace / name
    folder.mkdir(parents=True, exist_ok=True)
    # Writable by the pods' non-root users, as a shared file system's export for a team would be.
    folder.chmod(0o1777)
    result = subprocess.run([str(KUBECTL), f"--kubeconfig={layout.KUBECONFIG}", "apply", "-f", "-"],
                            input=volume_manifest(name, namespace, size), text=True, check=False)
    return result.returncode


def volume(args: argparse.Namespace) -> int:
    return make_volume(args.name, args.namespace, args.size)


def _unmount_under(folder: Path) -> None:
    """Mounts a killed pod left behind (pods mount in private namespaces, so normally none)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    targets = [line.split()[1] for line in mounts if line.split()[1].startswith(str(folder))]
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)


def _remove_pod_roots() -> None:
    """The pods' root filesystems (buildah working containers) a killed kubelet left."""
    if shutil.which("buildah") is None:
        return
    listed = subprocess.run(["buildah", "containers", "--format", "{{.ContainerName}}"], capture_output=True,
                            text=True, check=False)
    for name in listed.stdout.split():
        if name.startswith("dtrain-pod-"):
            subprocess.run(["buildah", "rm", name], capture_output=True, check=False)


def down(_: argparse.Namespace) -> int:
    # Every node's kubelet, those `join` added too: each has its pid file in layout.RUN.
    kubelets = [n for n in processes.names() if n.startswith(KUBELET_PREFIX)]
    for name in kubelets + [schedulers.PROCESS, "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd",
                            S3_GATEWAY]:
        processes.stop(name)
    # The pods' processes run in sessions of their own: whatever a kubelet left is ended here.
    subprocess.run(["pkill", "-KILL", "-f", str(layout.REPO / "tools" / "cluster" / "localcluster" / "podinit.py")],
                   check=False)
    network.teardown()
    _unmount_under(layout.NODES)
    _remove_pod_roots()
    for path in (layout.RUN, layout.ETCD_DATA, layout.NODES, layout.VOLUMES, layout.OBJECTS, layout.PKI, layout.LOGS):
        shutil.rmtree(path, ignore_errors=True)
    for path in (layout.KUBECONFIG, layout.CONFIG, layout.S3_KEYS, schedulers.CONFIG_FILE):
        path.unlink(missing_ok=True)
    print("cluster: stopped; nothing of it runs")
    return 0


def status(_: argparse.Namespace) -> int:
    names = processes.names()
    if not names:
        print("cluster: not running (make cluster starts it)")
        return 1
    for name in names:
        pid = processes.running(name)
        print(f"{name:28} {'running, pid ' + str(pid) if pid else 'NOT RUNNING (log: ' + str(processes.log_file(name)) + ')'}")
    print(f"export KUBECONFIG={layout.KUBECONFIG}")
    return 0 if all(processes.running(n) for n in names) else 1


def _second_schedulers(text: str) -> list[str]:
    try:
        return schedulers.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str]) -> int:
    if argv[:1] == ["kubelet"]:
        from . import kubelet

        return kubelet.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start the cluster")
    start.add_argument("--nodes", type=int, default=2)
    start.add_argument("--gpus-per-node", type=int, default=0, help="nvidia.com/gpu allocatable per node (counted, not devices)")
    start.add_argument("--cpu-per-node", default=DEFAULT_CPU)
    start.add_argument("--memory-per-node", default=DEFAULT_MEMORY)
    start.add_argument("--no-operator", action="store_true", help="do not install the operator")
    start.add_argument("--schedulers", type=_second_schedulers, default=[], metavar="NAME[,NAME]",
                       help=f"second schedulers to start beside kube-scheduler: {', '.join(schedulers.KNOWN)} "
                       f"(scheduler-plugins, schedulerName {schedulers.SCHEDULER_NAME}; built the first time)")
    start.add_argument("--kueue", action="store_true", help="build and install Kueue (make cluster KUEUE=1)")
    start.add_argument("--pods-from", choices=("images", "host"), default=os.environ.get("PODS_FROM") or "images",
                       help="run containers from their images (default; built when missing) or from this machine's "
                       "Python environment (quick local loops)")
    start.set_defaults(run=up)
    commands.add_parser("join", help="one more node in the running cluster, as `up` made each").set_defaults(run=join)
    lost = commands.add_parser("lose", help="a node lost: its kubelet stopped and its Node deleted")
    lost.add_argument("node", help="node-N")
    lost.set_defaults(run=lose)
    back = commands.add_parser("rejoin", help="a lost node back: its kubelet started again")
    back.add_argument("node", help="node-N")
    back.set_defaults(run=rejoin)
    commands.add_parser("down", help="stop the cluster and remove its state").set_defaults(run=down)
    commands.add_parser("status", help="what runs").set_defaults(run=status)
    commands.add_parser("kueue", help="build and install Kueue in the running cluster").set_defaults(run=start_kueue)
    commands.add_parser("anchors", help="build and install JobSet, Kubeflow Trainer and the Training Operator in the "
                        "running cluster").set_defaults(run=start_anchors)
    binaries = commands.add_parser("build", help="build the binaries `up` runs, start nothing")
    binaries.add_argument("--schedulers", type=_second_schedulers, default=[], metavar="NAME[,NAME]")
    binaries.add_argument("--kueue", action="store_true")
    binaries.add_argument("--anchors", action="store_true", help="the anchors' controllers (make bench-anchors)")
    binaries.set_defaults(run=build)
    claim = commands.add_parser("volume", help="a ReadWriteMany claim (for spec.storage.claimName)")
    claim.add_argument("name")
    claim.add_argument("-n", "--namespace", default=layout.JOB_NAMESPACE)
    claim.add_argument("--size", default=layout.SHARED_CLAIM_SIZE)
    claim.set_defaults(run=volume)
    args = parser.parse_args(argv)
    if args.command == "up" and args.nodes < 1:
        parser.error("--nodes must be at least 1")
    try:
        return args.run(args)
    except (ClusterError, RuntimeError, pki.PkiError) as exc:
        print(f"cluster: FAILED: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
