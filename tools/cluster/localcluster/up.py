"""`python -m localcluster up`, `build`, `kueue` and `anchors`: the cluster started (control plane, S3 gateway,
kubelets, the operator by helm, second schedulers and Kueue when asked), its binaries built, and what
joins a running one later."""


from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import time
from typing import Any

from . import anchors, controlplane, kueue, layout, network, objectstore, pki, processes, schedulers
from .claims import make_volume
from .cluster import (
    HELM,
    KUBECTL,
    OPERATOR_NAMESPACE,
    RELEASE,
    S3_GATEWAY,
    ClusterError,
    _check_ports,
    _start_kubelet,
    _wait_nodes_ready,
    cluster_config,
    kubectl,
    ports_needed,
)


def _prerequisites() -> None:
    try:
        network.probe()
    except network.NetworkError as exc:
        raise ClusterError(str(exc)) from exc
    for tool in (HELM, KUBECTL):
        if not tool.exists():
            raise ClusterError(f"{tool} is missing: run make tools")


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
