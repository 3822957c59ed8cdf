"""What a container's start needs, read from its pod: `$(VAR)` expanded, field references, the environment,
the hosts file that stands in for cluster DNS, and fsGroup on the pod's volumes."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import images, layout, network
from .podrun import PodRun
from .podstatus import StatusManager
from .volumes import PodVolumes

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

IMAGE_BACKOFF_SECONDS = 10  # the kubelet's image pull back-off: 10 s, doubling up to 5 minutes

MAX_IMAGE_BACKOFF_SECONDS = 300

HEADLESS_LABEL = "service.kubernetes.io/headless"  # on the EndpointSlices of a Service without a ClusterIP

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` in a container's command, args and env values: the variable's value when it is
    defined, left as written when not; `$$` is a literal `$` (k8s.io/kubernetes' third_party expansion)."""
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, text)


def field_value(run: PodRun, node_name: str, path: str) -> str:
    """The value of a fieldRef (downward API) of the pod running on the node `node_name`."""
    meta, spec = run.pod["metadata"], run.pod["spec"]
    values = {
        "metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
        "spec.nodeName": node_name, "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": run.net.address if run.net else "", "status.hostIP": layout.BRIDGE_ADDRESS,
    }
    if path in values:
        return values[path]
    if path.startswith(("metadata.labels['", "metadata.annotations['")):
        kind, key = path.split("['", 1)
        return str((meta.get(kind.split(".")[1]) or {}).get(key.rstrip("']"), ""))
    raise RuntimeError(f"fieldRef {path!r} is not supported by this kubelet")


async def container_environment(run: PodRun, volumes: PodVolumes, home: str, node_name: str, from_host: bool,
                      env_bin: Path) -> dict[str, str]:
    """The container's environment: its image's (or, `from_host`, this machine's Python environment from
    `env_bin`), the kubernetes Service's, and the pod's own env with its references resolved."""
    assert run.image is not None
    if from_host:
        env = {"PATH": f"{env_bin}:{DEFAULT_PATH}", "HOME": home, "PYTHONUNBUFFERED": "1",
               "PYTHONDONTWRITEBYTECODE": "1"}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]  # a user's modules, "in the image"
    else:
        env = {"PATH": DEFAULT_PATH, "HOME": home, **run.image.env}
    env.update({
        "HOSTNAME": run.pod["spec"].get("hostname") or run.name,
        # No kube-proxy: the API server's own address stands for the kubernetes Service's ClusterIP.
        "KUBERNETES_SERVICE_HOST": layout.BRIDGE_ADDRESS,
        "KUBERNETES_SERVICE_PORT": str(layout.APISERVER_PORT),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(layout.APISERVER_PORT),
        "KUBERNETES_PORT": f"tcp://{layout.BRIDGE_ADDRESS}:{layout.APISERVER_PORT}",
    })
    if os.environ.get("OMP_NUM_THREADS"):
        env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]  # the node's CPU share: no cgroup limits here
    for var in run.container.get("env") or []:
        source = var.get("valueFrom") or {}
        if "fieldRef" in source:
            env[var["name"]] = field_value(run, node_name, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            data = await volumes.secret_data(ref["name"], ref.get("optional", False))
            env[var["name"]] = data.get(ref["key"], b"").decode()
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            data = await volumes.config_map_data(ref["name"], ref.get("optional", False))
            env[var["name"]] = data.get(ref["key"], b"").decode()
        elif source:
            raise RuntimeError(f"env {var['name']}: this kubelet reads fieldRef, secretKeyRef and configMapKeyRef")
        else:
            env[var["name"]] = expand(str(var.get("value", "")), env)
    return env


def hosts_for(run: PodRun, endpoint_slices: dict[str, dict[str, Any]]) -> str:
    """The pod's hosts file, as cluster DNS answers: the names of its namespace's headless Services'
    endpoints (`<hostname>.<service>...`), and each headless Service's own name, in any namespace,
    with one line per ready endpoint (`<service>.<namespace>.svc`: every address, as an A lookup; the name
    alone in the pod's own namespace, as its search path finds it: PyTorchJob's MASTER_ADDR is one)."""
    entries = []
    for endpoint_slice in endpoint_slices.values():
        meta = endpoint_slice["metadata"]
        labels = meta.get("labels") or {}
        service = labels.get("kubernetes.io/service-name")
        if not service:
            continue
        if HEADLESS_LABEL in labels:
            svc = f"{service}.{meta.get('namespace')}"
            names = [f"{svc}.svc.{layout.CLUSTER_DOMAIN}", f"{svc}.svc", svc]
            if meta.get("namespace") == run.namespace:
                names.append(service)  # the pod's DNS search path (<namespace>.svc...) finds it by its name
            for endpoint in endpoint_slice.get("endpoints") or []:
                if endpoint.get("addresses") and (endpoint.get("conditions") or {}).get("ready") is not False:
                    entries.append((endpoint["addresses"][0], names))
        if meta.get("namespace") != run.namespace:
            continue
        for endpoint in endpoint_slice.get("endpoints") or []:
            hostname = endpoint.get("hostname")
            if not hostname or not endpoint.get("addresses"):
                continue
            fqdn = f"{hostname}.{service}.{run.namespace}.svc"
            names = [f"{fqdn}.{layout.CLUSTER_DOMAIN}", fqdn, f"{hostname}.{service}.{run.namespace}",
                     f"{hostname}.{service}"]
            entries.append((endpoint["addresses"][0], names))
    own = run.pod["spec"].get("hostname") or run.name
    return network.hosts_file((own, run.net.address if run.net else "127.0.0.1"), entries)


def own_volumes(run: PodRun, mounts: list[dict[str, Any]], user: dict[str, Any]) -> None:
    """fsGroup, as a kubelet applies it: the pod's writable volumes belong to the group, setgid, group-writable;
    the termination-message file is the container user's."""
    group = (run.pod["spec"].get("securityContext") or {}).get("fsGroup")
    for mount in mounts:
        source = mount.get("source")
        if not source or not source.startswith(str(run.folder)):
            continue  # claims: their PersistentVolume's own permissions, as for hostPath volumes
        path = Path(source)
        if mount["type"] == "file":
            os.chown(path, user["uid"], user["gid"])
            path.chmod(0o666)
        elif group is not None and not mount.get("readOnly"):
            for item in [path, *path.rglob("*")]:
                os.chown(item, -1, group)
                item.chmod(item.stat().st_mode | (0o2070 if item.is_dir() else 0o060))


async def pull(run: PodRun, from_host: bool, status: StatusManager) -> None:
    """The image's configuration, as a kubelet pulls: an image missing from the store is reported
    (ErrImagePull, then ImagePullBackOff; ErrImageNeverPull for `Never`) and looked for again."""
    image = run.container.get("image", "")
    if from_host:
        run.image = images.dockerfile_config(image)
        return
    backoff = IMAGE_BACKOFF_SECONDS
    while not run.terminating:
        try:
            run.image = images.store_config(image)
            return
        except images.ImageNotPresent as exc:
            never = run.container.get("imagePullPolicy") == "Never"
            reason = "ErrImageNeverPull" if never else "ErrImagePull"
            message = (f'Container image "{image}" is not present with pull policy of Never' if never else
                       f'failed to pull image "{image}": not in this node\'s image store ({exc}), and this node '
                       "pulls from no registry (make images builds dtrain's)")
            await status.waiting(run, reason, message)
            await asyncio.sleep(backoff / 2)
            if not never:
                await status.waiting(run, "ImagePullBackOff", f'Back-off pulling image "{image}"')
            await asyncio.sleep(backoff / 2)
            backoff = min(backoff * 2, MAX_IMAGE_BACKOFF_SECONDS)
    raise RuntimeError("deleted while its image was missing")
