"""The second schedulers `up --schedulers` starts beside kube-scheduler (make cluster SCHEDULERS=...).

coscheduling: scheduler-plugins' scheduler (kube-scheduler with the coscheduling plugin registered, as
upstream's own cmd/scheduler registers it), built unmodified from its Go module (tools/cluster/coscheduling:
go.mod and go.sum pin it), as a second profile-named scheduler, `scheduler-plugins-scheduler`: a job's
`spec.scheduling {schedulerName: scheduler-plugins-scheduler, gang: {enabled: true, provider: scheduler-plugins}}`
gets its PodGroup (scheduling.x-k8s.io/v1alpha1). The PodGroup CRD is read from that module's own files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from . import controlplane, layout, pki, processes

KNOWN = ("coscheduling",)

SCHEDULER_NAME = "scheduler-plugins-scheduler"  # the schedulerName a job names
PROCESS = "scheduler-plugins"
MODULE = layout.REPO / "tools" / "cluster" / "coscheduling"
PACKAGE = "sigs.k8s.io/scheduler-plugins"
COMMAND = f"{PACKAGE}/cmd/scheduler"
BINARY = layout.BIN / "scheduler-plugins"
CONFIG_FILE = layout.STATE / "scheduler-plugins.json"
CRD = "podgroups.scheduling.x-k8s.io"
# The longest a placed pod waits at Permit for the rest of its gang, unless its PodGroup says otherwise
# (scheduleTimeoutSeconds, which dtrain sets from gang.scheduleTimeoutSeconds); upstream's sample value.
PERMIT_WAITING_SECONDS = 10
# A gang's pods rejected at Permit are retried only on the events the Coscheduling plugin registers (a pod
# or a PodGroup added, a PodGroup updated), not on a node joining, so without this they wait for the
# queue's periodic flush of unschedulable pods: 5 min by default, 10 s here (the flush runs every 30 s),
# so that a node joining (make cluster-join) lets a waiting gang start within about 30 s.
UNSCHEDULABLE_RETRY = "10s"


def parse(text: str) -> list[str]:
    """`--schedulers`' value: comma-separated names of KNOWN (none for an empty value)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in KNOWN]
    if unknown:
        raise ValueError(f"unknown scheduler {unknown[0]!r}: SCHEDULERS takes {', '.join(KNOWN)} "
                         "(comma-separated), or nothing for kube-scheduler alone")
    return list(dict.fromkeys(names))


def pinned_versions() -> tuple[str, str]:
    """The scheduler-plugins release go.mod requires, and the Kubernetes release it replaces k8s.io/kubernetes with."""
    kubernetes = re.search(
        r"^\s*k8s\.io/kubernetes => k8s\.io/kubernetes (v\S+)", (MODULE / "go.mod").read_text(), re.MULTILINE
    )
    if kubernetes is None:
        raise RuntimeError(f"{MODULE / 'go.mod'} pins no k8s.io/kubernetes")
    return controlplane.required_version(MODULE, PACKAGE), kubernetes.group(1)


def build() -> None:
    plugins, kubernetes = pinned_versions()
    # Stamped with the kube-scheduler release it is (as the control plane is): a v0.x stamp, scheduler-plugins'
    # own release, makes its compatibility version 0.34, which kube-scheduler refuses at start.
    flags = [f.format(v=kubernetes, minor=kubernetes.split(".")[1]) for f in controlplane.GO_BUILD_FLAGS]
    controlplane.build_from_module(
        MODULE, COMMAND, BINARY, flags,
        f"cluster: building scheduler-plugins {plugins} (the coscheduling scheduler; kube-scheduler {kubernetes}) "
        "from its Go module (first time ~4-5 min on 2 cores; Go's caches make the next one fast)",
    )


def crd_file() -> Path:
    """The PodGroup CRD of the pinned release, from the module's own files (Go's module cache)."""
    path = controlplane.module_dir(MODULE, PACKAGE) / "manifests" / "coscheduling" / "crd.yaml"
    if not path.is_file():
        raise RuntimeError(f"no PodGroup CRD in {PACKAGE}'s module ({path})")
    return path


def config(kubeconfig: Path) -> dict[str, Any]:
    """The KubeSchedulerConfiguration: one profile, the default plugins with Coscheduling added and its
    queue sort (a gang's pods one after the other), as upstream's manifests/coscheduling/scheduler-config.yaml."""
    coscheduling = [{"name": "Coscheduling"}]
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        # One instance, as kube-scheduler runs here; no Lease to take.
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "enableProfiling": False,
        "profiles": [{
            "schedulerName": SCHEDULER_NAME,
            "plugins": {"multiPoint": {"enabled": coscheduling},
                        "queueSort": {"enabled": coscheduling, "disabled": [{"name": "*"}]}},
            "pluginConfig": [{"name": "Coscheduling",
                              "args": {"permitWaitingTimeSeconds": PERMIT_WAITING_SECONDS}}],
        }],
    }


def rbac() -> dict[str, Any]:
    """What the scheduler needs beyond kube-scheduler's own role, whose credentials it runs with: reading
    PodGroups (it writes none; upstream's all-in-one.yaml grants this under the same name, and more)."""
    name = "system:kube-scheduler:plugins"
    meta = {"name": name, "labels": {"app.kubernetes.io/managed-by": "localcluster"}}
    return {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta,
         "rules": [{"apiGroups": ["scheduling.x-k8s.io"], "resources": ["podgroups"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-scheduler"}]},
    ]}


def argv(config_file: Path, kubeconfig: Path, cert: Path, key: Path) -> list[str]:
    return [str(BINARY), f"--config={config_file}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            # kube-scheduler holds 10259; a serving certificate of the cluster's CA, so /healthz can be checked.
            "--bind-address=127.0.0.1", f"--secure-port={layout.COSCHEDULING_PORT}",
            f"--tls-cert-file={cert}", f"--tls-private-key-file={key}",
            # A flag of its own: the configuration file has no such field.
            f"--pod-max-in-unschedulable-pods-duration={UNSCHEDULABLE_RETRY}", "--v=1"]


def start() -> None:
    """The coscheduling scheduler (after kube-scheduler, whose kubeconfig it uses; its CRD and RBAC applied)."""
    kubeconfig = layout.PKI / "scheduler.kubeconfig"
    CONFIG_FILE.write_text(json.dumps(config(kubeconfig), indent=1))  # JSON is YAML
    cert, key = pki.serving(PROCESS, PROCESS, ["127.0.0.1"])
    processes.start(PROCESS, argv(CONFIG_FILE, kubeconfig, cert, key))
    processes.wait_until(lambda: controlplane.healthy(f"https://127.0.0.1:{layout.COSCHEDULING_PORT}/healthz"),
                         f"{PROCESS}'s /healthz", 60, PROCESS)
