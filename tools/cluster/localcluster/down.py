"""`python -m localcluster down`: everything `up` started stopped, and its state removed."""


from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

from . import layout, network, processes, schedulers
from .cluster import (
    KUBELET_PREFIX,
    S3_GATEWAY,
)


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
