"""`python -m localcluster volume`: a ReadWriteMany claim on a hostPath PersistentVolume of its own."""


from __future__ import annotations

import argparse
import json
import subprocess

from . import layout
from .cluster import (
    KUBECTL,
)


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
