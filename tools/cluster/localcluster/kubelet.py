"""The project's kubelet: one process per Node, a client of the real API server with the node's
own credentials (`system:node:<name>` in `system:nodes`, so the Node authorizer and NodeRestriction
apply to it), running each pod the scheduler binds to its node as real processes.

What it does, as a kubelet does:
- registers its Node (allocatable CPU, memory, pods and, when asked, `nvidia.com/gpu`), keeps its
  status and its Lease in kube-node-lease fresh;
- watches the pods bound to its node (`spec.nodeName`), runs each in its own network namespace
  (network.py) and its own PID, mount and UTS namespaces, where podinit.py mounts the volumes
  (volumes.py: ConfigMaps, Secrets, projected service-account tokens from the TokenRequest API,
  claims bound to hostPath/local PersistentVolumes, emptyDirs) and becomes the container's command;
- reports status through `pods/status`: Pending (ContainerCreating) → Running (podIP, Ready after the
  readiness probe, when there is one) → Succeeded/Failed with the exit code, reason and termination
  message; restarts the container for `restartPolicy: Always/OnFailure` with a back-off;
- finishes a graceful deletion: SIGTERM, SIGKILL after the grace period, then deletes the pod
  with a zero grace period;
- serves `kubectl logs` (`/containerLogs/...`) over HTTPS to the API server's client certificate.

What stands in: there is no container runtime here. Each container runs from its image's root
filesystem in the local containers-storage (images.py: a copy-on-write layer of its own, the
image's ENTRYPOINT, CMD, ENV, WORKDIR and USER, securityContext's user, groups, read-only root and
dropped capabilities), or, with `--pods-from host`, with this machine's Python environment; there
are no cgroup limits and no registry to pull from; there is no CoreDNS and no kube-proxy: each pod's hosts file is written from the
EndpointSlices of its namespace, and KUBERNETES_SERVICE_HOST names the API server's own address
(ClusterIPs do not route). One container per pod; no liveness or startup probes, no exec.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import ssl
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web

from . import images, layout, network, pki
from .api import Api, ApiError
from .securitycontext import container_user
from .volumes import PodVolumes, VolumeNotReady

log = logging.getLogger("localcluster.kubelet")

PODINIT = Path(__file__).with_name("podinit.py")
# How soon a changed ConfigMap or Secret reaches the pods that mount it (a real kubelet: its sync period,
# a minute by default, plus its cache's TTL).
VOLUME_SYNC_SECONDS = 10
HEARTBEAT_SECONDS = 10
LEASE_SECONDS = 40
DEFAULT_GRACE_SECONDS = 30
LOG_TAIL_LINES = 80
LOG_TAIL_BYTES = 2048
MAX_BACKOFF_SECONDS = 60
IMAGE_BACKOFF_SECONDS = 10  # the kubelet's image pull back-off: 10 s, doubling up to 5 minutes
MAX_IMAGE_BACKOFF_SECONDS = 300
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
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
PODS_PER_NODE = 110


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _end_pid_namespace(pidfd: int) -> None:
    """SIGKILL to the pod's PID 1, which ends every process of its PID namespace, as a runtime ends a
    stopped container's. unshare's --kill-child does not cover it: the parent-death signal is cleared
    when PID 1 takes the container's user, so a container whose unshare was killed would run on,
    holding its ports, beside the container started again."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended with its unshare, as it should
    finally:
        os.close(pidfd)


def _log_failure(task: asyncio.Task) -> None:
    """A pod's task that failed is a kubelet bug: said in the log, never silent."""
    if not task.cancelled() and task.exception() is not None:
        log.error("a pod's task failed", exc_info=task.exception())


def status_patch(status: dict[str, Any]) -> dict[str, Any]:
    """A strategic merge patch of the kubelet's part of a pod's status: its conditions merge by type, so that
    those of others stay (the eviction API's DisruptionTarget, Kueue's TerminationTarget), as a kubelet's
    status manager keeps them; its container statuses replace the old ones whole."""
    patch = dict(status)
    if "containerStatuses" in patch:
        patch["containerStatuses"] = [*patch["containerStatuses"], {"$patch": "replace"}]
    return patch


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    pod: dict[str, Any]
    folder: Path
    net: network.PodNetwork | None = None
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: str = ""
    ready: bool = False
    finished: bool = False
    terminating: bool = False
    task: asyncio.Task | None = None
    last_state: dict[str, Any] = field(default_factory=dict)
    image: images.ImageConfig | None = None
    waiting: dict[str, Any] = field(default_factory=dict)  # why the container is not running yet
    pending_status: dict[str, Any] = field(default_factory=dict)  # not yet taken by the API server
    status_sender: asyncio.Task | None = None
    volumes: PodVolumes | None = None

    @property
    def root_name(self) -> str:
        """The buildah working container that holds this pod's root filesystem."""
        return f"dtrain-pod-{self.uid}"

    @property
    def container(self) -> dict[str, Any]:
        return self.pod["spec"]["containers"][0]

    def all_pids(self) -> list[int]:
        """Every process of the pod (unshare and its descendants), on the machine's side."""
        if self.process is None:
            return []
        found, todo = [], [self.process.pid]
        while todo:
            pid = todo.pop()
            if Path(f"/proc/{pid}").exists():
                found.append(pid)
                todo.extend(_children(pid))
        return found

    @property
    def container_pid(self) -> int | None:
        """PID 1 of the pod's PID namespace: the container's main process."""
        if self.process is None or self.process.returncode is not None:
            return None
        children = _children(self.process.pid)
        return children[0] if children else None


class Kubelet:
    def __init__(self, node: layout.Node, cpu: str, memory: str, gpus: int, pods_from: str = "images") -> None:
        self.node = node
        self.pods_from = pods_from
        self.capacity = {"cpu": cpu, "memory": memory, "pods": str(PODS_PER_NODE)}
        if gpus:
            self.capacity["nvidia.com/gpu"] = str(gpus)
        self.cert, self.key = pki.client(f"{node.name}-client", f"system:node:{node.name}", "system:nodes")
        self.api = Api(self.cert, self.key)
        self.runs: dict[str, PodRun] = {}
        self.endpoint_slices: dict[str, dict[str, Any]] = {}
        self.free = list(range(2, 250))
        self.env_bin = Path(sys.executable).parent

    # --- The node ----------------------------------------------------------------------------------

    def _node_status(self) -> dict[str, Any]:
        stamp = now()
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "dtrain local kubelet is ready",
                 "lastHeartbeatTime": stamp}
        pressure = [{"type": t, "status": "False", "reason": f"KubeletHasNo{t}", "lastHeartbeatTime": stamp}
                    for t in ("MemoryPressure", "DiskPressure", "PIDPressure")]
        return {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": [ready, *pressure],
            "addresses": [{"type": "InternalIP", "address": layout.BRIDGE_ADDRESS},
                          {"type": "Hostname", "address": self.node.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.node.kubelet_port}},
            "nodeInfo": {
                "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": os.uname().release,
                "osImage": "dtrain local kubelet (processes in namespaces)", "containerRuntimeVersion": "namespaces://0",
                "kubeletVersion": layout.KUBERNETES_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    async def register(self) -> None:
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.node.name, "labels": {
                "kubernetes.io/hostname": self.node.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "dtrain-local",
            }},
            "spec": {"podCIDR": self.node.pod_cidr, "podCIDRs": [self.node.pod_cidr]},
        }
        with contextlib.suppress(ApiError):
            await self.api.request("POST", "/api/v1/nodes", node)
        await self.api.patch(f"/api/v1/nodes/{self.node.name}/status", {"status": self._node_status()}, "strategic")

    async def heartbeat(self) -> None:
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node.name}"
        while True:
            micro = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": self.node.name, "namespace": "kube-node-lease"},
                     "spec": {"holderIdentity": self.node.name, "leaseDurationSeconds": LEASE_SECONDS,
                              "renewTime": micro}}
            try:
                try:
                    await self.api.patch(lease_path, {"spec": lease["spec"]})
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    await self.api.request("POST", lease_path.rsplit("/", 1)[0], lease)
                await self.api.patch(f"/api/v1/nodes/{self.node.name}/status", {"status": self._node_status()},
                                     "strategic")
            except ApiError as exc:
                log.warning("heartbeat: %s", exc)
            await asyncio.sleep(HEARTBEAT_SECONDS)

    async def sync_volumes(self) -> None:
        """A changed ConfigMap or Secret reaches the running pods that mount it, as a kubelet's periodic
        sync brings it (a controller that writes its own serving certificate into a Secret waits for that)."""
        while True:
            await asyncio.sleep(VOLUME_SYNC_SECONDS)
            for run in list(self.runs.values()):
                if run.volumes is not None and not run.finished:
                    await run.volumes.resync()

    # --- Watches -----------------------------------------------------------------------------------

    async def watch_pods(self) -> None:
        async for kind, obj in self.api.watch("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node.name}"):
            if kind == "SYNC":
                for pod in obj.get("items") or []:
                    self.on_pod(pod, adopting=True)
            elif kind == "DELETED":
                self.on_pod_deleted(obj)
            else:
                self.on_pod(obj)

    async def watch_endpoint_slices(self) -> None:
        async for kind, obj in self.api.watch("/apis/discovery.k8s.io/v1/endpointslices"):
            if kind == "SYNC":
                self.endpoint_slices = {s["metadata"]["uid"]: s for s in obj.get("items") or []}
            elif kind == "DELETED":
                self.endpoint_slices.pop(obj["metadata"]["uid"], None)
            else:
                self.endpoint_slices[obj["metadata"]["uid"]] = obj
            self.refresh_hosts()

    def on_pod(self, pod: dict[str, Any], adopting: bool = False) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        run = self.runs.get(uid)
        if run is None:
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                if meta.get("deletionTimestamp"):
                    asyncio.create_task(self._remove(meta["namespace"], meta["name"], uid))
                return
            folder = self.node.folder / "pods" / f"{meta['namespace']}_{meta['name']}_{uid[:8]}"
            run = self.runs[uid] = PodRun(uid, meta["namespace"], meta["name"], pod, folder)
            if adopting and (pod.get("status") or {}).get("startTime"):
                # Started by an earlier run of this kubelet: its processes are gone with it.
                run.task = asyncio.create_task(self._lost(run))
                return
            run.task = asyncio.create_task(self.run_pod(run))
            run.task.add_done_callback(_log_failure)
        run.pod = pod
        if meta.get("deletionTimestamp") and not run.terminating:
            run.terminating = True
            asyncio.create_task(self.terminate(run, meta.get("deletionGracePeriodSeconds")))

    def on_pod_deleted(self, pod: dict[str, Any]) -> None:
        run = self.runs.pop(pod["metadata"]["uid"], None)
        if run is not None:
            self.kill_all(run)
            self.release(run)

    # --- One pod -----------------------------------------------------------------------------------

    async def patch_status(self, run: PodRun, status: dict[str, Any]) -> None:
        """The pod's status, as the kubelet's status manager keeps it: the newest value of each field is
        sent, again and again while the API server does not answer; a pod deleted meanwhile is left be."""
        run.pending_status.update(status)
        if run.status_sender is None or run.status_sender.done():
            run.status_sender = asyncio.create_task(self._send_status(run))

    async def _send_status(self, run: PodRun) -> None:
        while run.pending_status:
            status, run.pending_status = run.pending_status, {}
            try:
                await self.api.patch(f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status",
                                     {"status": status_patch(status)}, "strategic")
            except ApiError as exc:
                if not exc.transient:
                    return  # 404: the pod is gone
                run.pending_status = {**status, **run.pending_status}
                await asyncio.sleep(1)

    def _container_status(self, run: PodRun, state: dict[str, Any]) -> list[dict[str, Any]]:
        container = run.container
        status = {
            "name": container["name"], "image": container.get("image", ""),
            "imageID": f"namespaces://{container.get('image', '')}",
            "containerID": f"namespaces://{run.uid}-{run.restarts}",
            "ready": run.ready, "started": "running" in state, "restartCount": run.restarts, "state": state,
        }
        if run.last_state:
            status["lastState"] = run.last_state
        return [status]

    def _conditions(self, run: PodRun, initialized: bool) -> list[dict[str, Any]]:
        stamp = now()
        ready = "True" if run.ready else "False"
        return [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
            {"type": "Initialized", "status": "True" if initialized else "False", "lastTransitionTime": stamp},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": stamp},
            {"type": "Ready", "status": ready, "lastTransitionTime": stamp},
        ]

    async def _lost(self, run: PodRun) -> None:
        await self.finish(run, 137, "ContainerStatusUnknown", "the kubelet restarted and lost the container")

    async def run_pod(self, run: PodRun) -> None:
        if len(run.pod["spec"]["containers"]) != 1 or run.pod["spec"].get("initContainers"):
            await self.finish(run, 128, "ContainerCannotRun", "this kubelet runs pods of exactly one container")
            return
        await self.patch_status(run, {
            "phase": "Pending", "hostIP": layout.BRIDGE_ADDRESS, "hostIPs": [{"ip": layout.BRIDGE_ADDRESS}],
            "conditions": self._conditions(run, False),
            "containerStatuses": self._container_status(run, {"waiting": {"reason": "ContainerCreating"}}),
        })
        try:
            init = await self.prepare(run)
        except Exception as exc:  # a pod that cannot start is reported, never a dead kubelet
            log.exception("pod %s/%s cannot start", run.namespace, run.name)
            await self.finish(run, 128, "ContainerCannotRun", str(exc)[:1000])
            return
        backoff = 1.0
        while not run.terminating:
            code = await self.start_and_wait(run, init)
            policy = run.pod["spec"].get("restartPolicy", "Always")
            if run.terminating or policy == "Never" or (policy == "OnFailure" and code == 0):
                break
            run.last_state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                             "finishedAt": now(), "startedAt": run.started_at}}
            run.restarts += 1
            run.ready = False
            await self.patch_status(run, {"conditions": self._conditions(run, True), "containerStatuses":
                                          self._container_status(run, {"waiting": {"reason": "CrashLoopBackOff"}})})
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
        code = exit_code(run.process.returncode) if run.process and run.process.returncode is not None else 137
        await self.finish(run, code, "Completed" if code == 0 else "Error", self.termination_message(run, code))

    async def start_and_wait(self, run: PodRun, init: dict[str, Any]) -> int:
        """One start of the container: a fresh root from its image (as a runtime makes a new container),
        the user it runs as, podinit's spec, the process; until it exits."""
        root = None
        if not self.from_host(run):
            root = await asyncio.to_thread(images.mount_root, run.container["image"], run.root_name)
        user, refused = (None, None) if root is None else container_user(run.pod, run.container, run.image.user, root)
        if refused:
            await self.report_waiting(run, "CreateContainerConfigError", refused)
            while not run.terminating:
                await asyncio.sleep(1)
            return 128
        if user is not None:
            self.own_volumes(run, init["mounts"], user)
        spec_file = run.folder / "podinit.json"
        spec_file.write_text(json.dumps({**init, "rootfs": root, "user": user}, indent=1))
        try:
            return await self._run_process(run, spec_file)
        finally:
            if root is not None:
                await asyncio.to_thread(images.remove_root, run.root_name)

    async def _run_process(self, run: PodRun, spec_file: Path) -> int:
        log_file = (run.folder / "container.log").open("ab")
        assert run.net is not None
        run.process = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", run.net.netns,
            "unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation",
            "private", sys.executable, str(PODINIT), str(spec_file),
            stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=asyncio.subprocess.STDOUT,
            env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}, start_new_session=True,
        )
        log_file.close()
        container_init = await self._container_init(run.process)
        run.waiting = {}
        run.started_at = now()
        probe = run.container.get("readinessProbe")
        run.ready = probe is None
        await self.patch_status(run, {
            "phase": "Running", "hostIP": layout.BRIDGE_ADDRESS, "podIP": run.net.address,
            "podIPs": [{"ip": run.net.address}], "startTime": run.pod.get("status", {}).get("startTime") or run.started_at,
            "conditions": self._conditions(run, True),
            "containerStatuses": self._container_status(run, {"running": {"startedAt": run.started_at}}),
        })
        prober = asyncio.create_task(self.probe_readiness(run, probe)) if probe else None
        try:
            returncode = await run.process.wait()
        finally:
            if prober is not None:
                prober.cancel()
            if container_init is not None:
                _end_pid_namespace(container_init)
        return exit_code(returncode)

    @staticmethod
    async def _container_init(process: asyncio.subprocess.Process) -> int | None:
        """A pidfd of the pod's PID 1 (unshare's child: podinit, then the container's command), once forked."""
        for _ in range(500):
            children = _children(process.pid)
            if children:
                with contextlib.suppress(ProcessLookupError):
                    return os.pidfd_open(int(children[0]))
            if process.returncode is not None:
                return None
            await asyncio.sleep(0.01)
        return None

    async def probe_readiness(self, run: PodRun, probe: dict[str, Any]) -> None:
        """httpGet and tcpSocket readiness probes, from the node, as a kubelet probes."""
        await asyncio.sleep(probe.get("initialDelaySeconds", 0))
        ports = {p.get("name"): p["containerPort"] for p in run.container.get("ports") or []}
        successes = failures = 0
        while True:
            ok = await self._probe_once(run, probe, ports)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            ready = (run.ready or successes >= probe.get("successThreshold", 1)) and failures < probe.get(
                "failureThreshold", 3)
            if ready != run.ready:
                run.ready = ready
                await self.patch_status(run, {
                    "conditions": self._conditions(run, True),
                    "containerStatuses": self._container_status(run, {"running": {"startedAt": run.started_at}}),
                })
            await asyncio.sleep(probe.get("periodSeconds", 10))

    async def _probe_once(self, run: PodRun, probe: dict[str, Any], ports: dict[Any, int]) -> bool:
        assert run.net is not None
        action = probe.get("httpGet") or probe.get("tcpSocket")
        if action is None:
            return True  # exec probes: no exec here; said in the module docstring
        port = action["port"]
        port = ports.get(port, port) if isinstance(port, str) else port
        timeout = probe.get("timeoutSeconds", 1)
        try:
            if "httpGet" in probe:
                url = f"http://{run.net.address}:{port}{action.get('path', '/')}"
                async with aiohttp.ClientSession() as session, session.get(
                        url, timeout=aiohttp.ClientTimeout(total=timeout)) as reply:
                    return 200 <= reply.status < 400
            _, writer = await asyncio.wait_for(asyncio.open_connection(run.net.address, port), timeout)
            writer.close()
            return True
        except (OSError, aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def finish(self, run: PodRun, code: int, reason: str, message: str) -> None:
        stamp = now()
        terminated: dict[str, Any] = {"exitCode": code, "reason": reason, "startedAt": run.started_at or stamp,
                                      "finishedAt": stamp, "containerID": f"namespaces://{run.uid}-{run.restarts}"}
        if message:
            terminated["message"] = message
        run.ready = False
        policy = run.pod["spec"].get("restartPolicy", "Always")
        terminal = "Succeeded" if code == 0 and policy != "Always" else "Failed"
        await self.patch_status(run, {
            "phase": terminal, "conditions": self._conditions(run, True),
            "containerStatuses": self._container_status(run, {"terminated": terminated}),
        })
        run.finished = True
        self.release(run)
        if run.terminating:
            await self._remove(run.namespace, run.name, run.uid)

    def termination_message(self, run: PodRun, code: int) -> str:
        path = run.folder / "termination-log"
        text = path.read_text(errors="replace") if path.exists() else ""
        if not text.strip() and code != 0 and run.container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            log_text = (run.folder / "container.log").read_text(errors="replace")
            text = "\n".join(log_text.splitlines()[-LOG_TAIL_LINES:])[-LOG_TAIL_BYTES:]
        return text[-4096:]

    # --- Sandbox, volumes, environment -------------------------------------------------------------

    def field_value(self, run: PodRun, path: str) -> str:
        meta, spec = run.pod["metadata"], run.pod["spec"]
        values = {
            "metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
            "spec.nodeName": self.node.name, "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
            "status.podIP": run.net.address if run.net else "", "status.hostIP": layout.BRIDGE_ADDRESS,
        }
        if path in values:
            return values[path]
        if path.startswith(("metadata.labels['", "metadata.annotations['")):
            kind, key = path.split("['", 1)
            return str((meta.get(kind.split(".")[1]) or {}).get(key.rstrip("']"), ""))
        raise RuntimeError(f"fieldRef {path!r} is not supported by this kubelet")

    def from_host(self, run: PodRun) -> bool:
        """Whether the container runs from this machine's Python environment (PODS_FROM=host): the project's
        own images do; any other (Kueue's manager) runs from its image in the store either way."""
        return self.pods_from == "host" and images.is_project_image(run.container.get("image", ""))

    async def pull(self, run: PodRun) -> None:
        """The image's configuration, as a kubelet pulls: an image missing from the store is reported
        (ErrImagePull, then ImagePullBackOff; ErrImageNeverPull for `Never`) and looked for again."""
        image = run.container.get("image", "")
        if self.from_host(run):
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
                await self.report_waiting(run, reason, message)
                await asyncio.sleep(backoff / 2)
                if not never:
                    await self.report_waiting(run, "ImagePullBackOff", f'Back-off pulling image "{image}"')
                await asyncio.sleep(backoff / 2)
                backoff = min(backoff * 2, MAX_IMAGE_BACKOFF_SECONDS)
        raise RuntimeError("deleted while its image was missing")

    async def report_waiting(self, run: PodRun, reason: str, message: str) -> None:
        if run.waiting == {"reason": reason, "message": message}:
            return
        run.waiting = {"reason": reason, "message": message}
        await self.patch_status(run, {"phase": "Pending", "conditions": self._conditions(run, True),
                                      "containerStatuses": self._container_status(run, {"waiting": run.waiting})})

    def own_volumes(self, run: PodRun, mounts: list[dict[str, Any]], user: dict[str, Any]) -> None:
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

    async def prepare(self, run: PodRun) -> dict[str, Any]:
        """Everything a start of the container needs, but its root filesystem (made at each start)."""
        spec, container, folder = run.pod["spec"], run.container, run.folder
        folder.mkdir(parents=True, exist_ok=True)
        await self.pull(run)
        assert run.image is not None
        run.net = network.PodNetwork(self.node, self.free.pop(0))
        run.net.create(self.hosts_for(run))
        volumes = run.volumes = PodVolumes(self.api, run.pod, folder, lambda path: self.field_value(run, path))
        by_name = {v["name"]: v for v in spec.get("volumes") or []}
        mounts: list[dict[str, Any]] = []
        for mount in container.get("volumeMounts") or []:
            if mount["name"] not in by_name:
                raise RuntimeError(f"volumeMount {mount['name']!r} names no volume of the pod")
            while True:
                try:
                    mounts.append(await volumes.mount(by_name[mount["name"]], mount))
                    break
                except VolumeNotReady as exc:  # as a kubelet: retried, the pod stays ContainerCreating
                    log.info("pod %s/%s: %s; retrying", run.namespace, run.name, exc)
                    await asyncio.sleep(1)
                    if run.terminating:
                        raise RuntimeError(str(exc)) from exc
        termination = folder / "termination-log"
        termination.write_text("")
        mounts.append({"type": "file", "source": str(termination),
                       "target": container.get("terminationMessagePath", "/dev/termination-log")})
        host = self.from_host(run)
        home = folder / "home"
        home.mkdir(exist_ok=True)
        environment = await self.environment(run, volumes, str(home) if host else "/")
        argv = [expand(arg, environment) for arg in images.argv(container, run.image)]
        if not argv:
            raise RuntimeError(f"the container has no command, and its image {container.get('image')!r} none either")
        context = {**(spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
        return {
            "hostname": spec.get("hostname") or run.name,
            "mounts": mounts,
            "workingDir": container.get("workingDir") or run.image.workdir or (str(home) if host else "/"),
            "argv": argv,
            "env": environment,
            "ledger": str(self.node.folder / "created-mountpoints"),
            "devScratch": str(folder / "dev"),
            "readOnlyRootFilesystem": bool(context.get("readOnlyRootFilesystem")),
            "dropAllCapabilities": "ALL" in ((context.get("capabilities") or {}).get("drop") or []),
            "noNewPrivileges": context.get("allowPrivilegeEscalation") is False,
        }

    async def environment(self, run: PodRun, volumes: PodVolumes, home: str) -> dict[str, str]:
        assert run.image is not None
        if self.from_host(run):
            env = {"PATH": f"{self.env_bin}:{DEFAULT_PATH}", "HOME": home, "PYTHONUNBUFFERED": "1",
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
                env[var["name"]] = self.field_value(run, source["fieldRef"]["fieldPath"])
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

    def hosts_for(self, run: PodRun) -> str:
        """The pod's hosts file, as cluster DNS answers: the names of its namespace's headless Services'
        endpoints (`<hostname>.<service>...`), and each headless Service's own name, in any namespace,
        with one line per ready endpoint (`<service>.<namespace>.svc`: every address, as an A lookup; the name
        alone in the pod's own namespace, as its search path finds it: PyTorchJob's MASTER_ADDR is one)."""
        entries = []
        for endpoint_slice in self.endpoint_slices.values():
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

    def refresh_hosts(self) -> None:
        for run in self.runs.values():
            if run.net is not None and not run.finished:
                run.net.write_hosts(self.hosts_for(run))

    # --- Deletion ---------------------------------------------------------------------------------

    async def terminate(self, run: PodRun, given: int | None) -> None:
        """SIGTERM to the container's main process; SIGKILL to the whole pod after the grace period."""
        grace = given if given is not None else run.pod["spec"].get("terminationGracePeriodSeconds")
        grace = DEFAULT_GRACE_SECONDS if grace is None else int(grace)
        pid = run.container_pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while not run.finished and time.monotonic() < deadline:
            if run.process is None and (run.task is None or run.task.done()):
                break
            await asyncio.sleep(0.1)
        if not run.finished:
            self.kill_all(run)
            if run.task is not None and not run.task.done():
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(run.task), 15)
        if not run.finished:  # never started, or set up while deleted
            run.finished = True
            self.release(run)
        await self._remove(run.namespace, run.name, run.uid)

    async def _remove(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's last word on a terminated pod: delete it with a zero grace period (through an
        outage of the API server; 404 or a precondition that no longer holds: it is gone already)."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        await self.api.persist("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", options, gone=(404, 409))

    def kill_all(self, run: PodRun) -> None:
        for pid in run.all_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def release(self, run: PodRun) -> None:
        if run.net is not None:
            run.net.delete()
            index = int(run.net.address.rsplit(".", 1)[1])
            self.free.append(index)
            run.net = None

    # --- Logs --------------------------------------------------------------------------------------

    def _log_path(self, namespace: str, name: str) -> Path | None:
        for run in sorted(self.runs.values(), key=lambda r: r.started_at, reverse=True):
            if run.namespace == namespace and run.name == name:
                return run.folder / "container.log"
        matches = sorted((self.node.folder / "pods").glob(f"{namespace}_{name}_*/container.log"),
                         key=lambda p: p.stat().st_mtime)
        return matches[-1] if matches else None

    async def serve_logs(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        path = self._log_path(request.match_info["namespace"], request.match_info["pod"])
        if path is None or not path.exists():
            raise aiohttp.web.HTTPNotFound(text="no such pod on this node")
        text = path.read_text(errors="replace")
        if "tailLines" in request.query:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(request.query["tailLines"]):]) if int(request.query["tailLines"]) else ""
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(text.encode())
        if request.query.get("follow") in ("true", "1"):
            sent = path.stat().st_size
            while True:
                await asyncio.sleep(0.5)
                size = path.stat().st_size
                if size > sent:
                    with path.open("rb") as handle:
                        handle.seek(sent)
                        await response.write(handle.read(size - sent))
                    sent = size
                run = next((r for r in self.runs.values() if r.folder / "container.log" == path), None)
                if run is None or run.finished:
                    break
        return response

    async def start_log_server(self) -> aiohttp.web.AppRunner:
        app = aiohttp.web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self.serve_logs)
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        cert, key = pki.serving(f"{self.node.name}-serving", f"system:node:{self.node.name}", [])
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca()[0]))
        context.load_cert_chain(str(cert), str(key))
        context.verify_mode = ssl.CERT_REQUIRED  # only the API server's kubelet-client certificate
        await aiohttp.web.TCPSite(runner, layout.BRIDGE_ADDRESS, self.node.kubelet_port, ssl_context=context).start()
        return runner

    async def run(self) -> None:
        async with self.api:
            await self.register()
            runner = await self.start_log_server()
            try:
                await asyncio.gather(
                    self.heartbeat(), self.watch_pods(), self.watch_endpoint_slices(), self.sync_volumes()
                )
            finally:
                for run in self.runs.values():
                    self.kill_all(run)
                    self.release(run)
                await runner.cleanup()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="localcluster kubelet")
    parser.add_argument("--node", type=int, required=True, help="the node's index (1-based)")
    parser.add_argument("--cpu", default="4")
    parser.add_argument("--memory", default="16Gi")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--pods-from", choices=("images", "host"), default="images")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kubelet = Kubelet(layout.Node(args.node), args.cpu, args.memory, args.gpus, args.pods_from)
    loop = asyncio.new_event_loop()
    task = loop.create_task(kubelet.run())
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        loop.run_until_complete(task)
    return 0
