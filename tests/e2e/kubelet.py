"""A kubelet and a Job controller for the test API server: every pod runs as real processes.

This is test support, not a cluster. One "node" (this machine) runs every pod bound to nothing:

- **sandbox**: each pod gets its own network namespace with its own address on the node's bridge
  (tests/e2e/network.py), and its own PID, mount and UTS namespaces (`unshare`), in which
  tests/e2e/podinit.py mounts the volumes and becomes the container's command;
- **command**: the container's `command` + `args` exactly as rendered, run with the "image" of this
  machine: the interpreter and packages of the environment the harness runs in (PATH starts with
  its bin/). One difference, said here and in the README: there is no TensorRT and no GPU, so a
  container running `dtrain build-engine` (the engine Job) gets `--fallback onnxruntime` appended,
  the flag a TensorRT-less engine image would need;
- **environment**: the container's `env` as rendered (values and downward-API `fieldRef`s), then
  what a kubelet and the image add: HOSTNAME, KUBERNETES_SERVICE_HOST/PORT (the test API server on
  the bridge), PATH, HOME, PYTHONUNBUFFERED; OMP_NUM_THREADS and PYTHONPATH come from the harness's
  own environment (a node's CPU share, and a user's modules "in the image");
- **volumes**: a ConfigMap at its mount path (files written from the API object), a
  persistentVolumeClaim as one directory per claim shared by every pod that mounts it (the
  ReadWriteMany claim of spec.storage), an emptyDir per pod (tmpfs for medium Memory), the
  service-account token, ca.crt and namespace at /var/run/secrets/kubernetes.io/serviceaccount
  (unless automountServiceAccountToken is false), and the termination-message file at
  `terminationMessagePath`, all bind mounts in the pod's private mount namespace;
- **status**: Pending (PodScheduled) → Running (podIP, startTime, container running) →
  Succeeded/Failed with the exit code (128 + n for a signal), reason (Completed, Error,
  OOMKilled is never seen here), startedAt/finishedAt and the termination message (the file, or
  with FallbackToLogsOnError the log's tail when the file is empty and the container failed);
- **deletion**: graceful, as on a cluster (TERMINATION_FINALIZER below): a pod that gets a
  deletionTimestamp gets SIGTERM on its container's main process, then SIGKILL for the whole pod
  after its terminationGracePeriodSeconds (default 30); when its processes are gone, its network
  namespace goes and the object is removed from the API.

The Job controller creates one pod at a time from a Job's template, counts failures, and marks the
Job Complete, or Failed with BackoffLimitExceeded once failures exceed `backoffLimit`.

Reads come from the emulator's store in this process (as a kubelet's informer cache would);
writes go over HTTPS with the admin token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kmock

from tests.operator.apiserver import now_rfc3339
from tests.operator.cluster import container_status

from . import network

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger("e2e.kubelet")

PODS = kmock.resource("v1/pods")
JOBS = kmock.resource("batch/v1/jobs")
CONFIGMAPS = kmock.resource("v1/configmaps")
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_GRACE_SECONDS = 30
LOG_TAIL_LINES = 80
LOG_TAIL_BYTES = 2048
PODINIT = Path(__file__).parents[2] / "tools" / "cluster" / "localcluster" / "podinit.py"
SYNC_SECONDS = 0.1
API_PORT = 6443
# The one node this kubelet is: what the downward API gives for spec.nodeName.
NODE_NAME = "e2e-node"
# Graceful deletion, as the API server does it for pods: the emulator removes an object at once on
# DELETE unless it has finalizers, so the kubelet puts this one on every pod it runs. A DELETE then
# only sets deletionTimestamp; the pod stays, terminating, until its processes are gone and the
# kubelet takes the finalizer off. So the operator sees what it sees on a cluster: a terminating
# pod that still holds its name, until the old gang is really gone.
TERMINATION_FINALIZER = "e2e.dtrain.dev/kubelet-termination"


def signal_exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


@dataclass
class RunningPod:
    uid: str
    namespace: str
    name: str
    pod: dict[str, Any]
    folder: Path
    net: network.PodNetwork | None = None
    process: asyncio.subprocess.Process | None = None
    started_at: str = ""
    started_monotonic: float = 0.0
    finished: bool = False
    deleted_at: float | None = None
    task: asyncio.Task | None = None
    exit_code: int | None = None
    released: bool = False
    events: list[tuple[float, str]] = field(default_factory=list)

    @property
    def container_pid(self) -> int | None:
        """The host PID of the container's main process (PID 1 of the pod's PID namespace)."""
        if self.process is None or self.process.returncode is not None:
            return None
        children = _children(self.process.pid)
        return children[0] if children else None

    def all_pids(self) -> list[int]:
        """Every process of the pod, on the host's side (unshare and all its descendants)."""
        if self.process is None:
            return []
        found, todo = [], [self.process.pid]
        while todo:
            pid = todo.pop()
            if Path(f"/proc/{pid}").exists():
                found.append(pid)
                todo.extend(_children(pid))
        return found


class Kubelet:
    """Runs every pod of the test API server as processes; writes their status back."""

    def __init__(
        self,
        api: Any,
        request: Callable[..., Any],
        token_for: Callable[[str, str], str],
        folder: Path,
        ca_file: Path,
        env_bin: Path,
    ) -> None:
        self.api = api
        self.request = request
        self.token_for = token_for
        self.folder = folder
        self.ca_file = ca_file
        self.env_bin = env_bin
        self.pods: dict[str, RunningPod] = {}
        self.ledger = folder / "created-mountpoints"
        self._free = list(range(10, 250))
        self._task: asyncio.Task | None = None
        self.storage = folder / "storage"

    # --- Life cycle --------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for running in list(self.pods.values()):
            self._kill_all(running)
        for running in list(self.pods.values()):
            if running.task is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(running.task, 10)
            if running.net is not None:
                running.net.delete()
        self.remove_mountpoints()

    def remove_mountpoints(self) -> None:
        if not self.ledger.exists():
            return
        for path in sorted(set(self.ledger.read_text().split()), key=len, reverse=True):
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                elif os.path.isfile(path) and os.path.getsize(path) == 0:
                    os.unlink(path)

    async def _loop(self) -> None:
        while True:
            try:
                self.sync()
            except Exception:  # a kubelet keeps going
                log.exception("kubelet sync failed")
            await asyncio.sleep(SYNC_SECONDS)

    def _stored_pods(self) -> dict[str, dict[str, Any]]:
        pods = {}
        for (resource, _, _), obj in list(self.api.objects.items()):
            if resource != PODS or obj.deleted:
                continue
            raw = obj.last.raw
            pods[raw["metadata"]["uid"]] = raw
        return pods

    def sync(self) -> None:
        stored = self._stored_pods()
        for uid, pod in stored.items():
            if uid not in self.pods and not pod["metadata"].get("deletionTimestamp"):
                running = RunningPod(uid, pod["metadata"]["namespace"], pod["metadata"]["name"], pod,
                                     self.folder / "pods" / f"{pod['metadata']['name']}-{uid[:8]}")
                self.pods[uid] = running
                running.task = asyncio.create_task(self._run_pod(running))
        for uid, running in list(self.pods.items()):
            gone = uid not in stored or stored[uid]["metadata"].get("deletionTimestamp")
            if gone and running.deleted_at is None:
                running.deleted_at = time.monotonic()
                if not running.finished:
                    # A DELETE with gracePeriodSeconds (a hung gang's) overrides the pod's own grace.
                    given = stored[uid]["metadata"].get("deletionGracePeriodSeconds") if uid in stored else None
                    asyncio.create_task(self._terminate(running, given))
                elif uid in stored:
                    asyncio.create_task(self._let_go(running))  # finished before: nothing to stop
            if running.finished and gone and running.net is None:
                self.pods.pop(uid, None)

    # --- One pod -----------------------------------------------------------------------------------

    async def _patch_status(self, running: RunningPod, status: dict[str, Any]) -> None:
        if running.deleted_at is not None:
            return
        with contextlib.suppress(AssertionError):  # gone meanwhile: a kubelet's patch of a deleted pod 404s
            await self.request(
                "PATCH", f"/api/v1/namespaces/{running.namespace}/pods/{running.name}/status",
                {"status": status}, "application/merge-patch+json",
            )

    async def _hold(self, running: RunningPod) -> None:
        with contextlib.suppress(AssertionError):
            await self.request(
                "PATCH", f"/api/v1/namespaces/{running.namespace}/pods/{running.name}",
                {"metadata": {"finalizers": [TERMINATION_FINALIZER]}}, "application/merge-patch+json",
            )

    async def _let_go(self, running: RunningPod) -> None:
        """Take the finalizer off a pod being deleted: the API server removes it."""
        if running.released:
            return
        running.released = True
        with contextlib.suppress(AssertionError):
            await self.request(
                "PATCH", f"/api/v1/namespaces/{running.namespace}/pods/{running.name}",
                {"metadata": {"finalizers": None}}, "application/merge-patch+json",
            )

    async def _run_pod(self, running: RunningPod) -> None:
        pod = running.pod
        now = now_rfc3339()
        await self._hold(running)
        await self._patch_status(running, {
            "phase": "Pending",
            "hostIP": network.NODE_ADDRESS,
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
        })
        try:
            spec_file = await self._prepare(running)
        except Exception as exc:
            log.exception("pod %s/%s cannot start", running.namespace, running.name)
            await self._finish(running, 128, "ContainerCannotRun", str(exc), now)
            return
        if running.deleted_at is not None:
            running.finished = True
            self._release(running)
            await self._let_go(running)
            return
        container = pod["spec"]["containers"][0]
        log_file = (running.folder / "container.log").open("ab")
        running.process = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", running.net.netns,
            "unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation",
            "private", sys.executable, str(PODINIT), str(spec_file),
            stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=asyncio.subprocess.STDOUT,
            env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")},
            start_new_session=True,
        )
        log_file.close()
        running.started_at = now_rfc3339()
        running.started_monotonic = time.monotonic()
        await self._patch_status(running, {
            "phase": "Running",
            "hostIP": network.NODE_ADDRESS,
            "podIP": running.net.address,
            "podIPs": [{"ip": running.net.address}],
            "startTime": running.started_at,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": running.started_at}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": container_status(pod, {"running": {"startedAt": running.started_at}}, ready=True),
        })
        returncode = await running.process.wait()
        code = signal_exit_code(returncode)
        running.exit_code = code
        message = self._termination_message(running, container, code)
        reason = "Completed" if code == 0 else "Error"
        await self._finish(running, code, reason, message, running.started_at)

    async def _finish(self, running: RunningPod, code: int, reason: str, message: str, started: str) -> None:
        now = now_rfc3339()
        terminated = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now,
                      "containerID": f"e2e://{running.uid}"}
        if message:
            terminated["message"] = message
        await self._patch_status(running, {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}],
            "containerStatuses": container_status(running.pod, {"terminated": terminated}, ready=False),
        })
        running.finished = True
        self._release(running)
        if running.deleted_at is not None:
            await self._let_go(running)

    def _release(self, running: RunningPod) -> None:
        if running.net is not None:
            running.net.delete()
            self._free.append(running.net.index)
            running.net = None
        self._refresh_hosts()

    def _termination_message(self, running: RunningPod, container: dict[str, Any], code: int) -> str:
        path = running.folder / "termination-log"
        text = path.read_text(errors="replace") if path.exists() else ""
        policy = container.get("terminationMessagePolicy", "File")
        if not text.strip() and code != 0 and policy == "FallbackToLogsOnError":
            log_text = (running.folder / "container.log").read_text(errors="replace")
            text = "\n".join(log_text.splitlines()[-LOG_TAIL_LINES:])[-LOG_TAIL_BYTES:]
        return text[-4096:]

    # --- Sandbox, volumes, environment -----------------------------------------------------------

    def _configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        key = (CONFIGMAPS, namespace, name)
        if key not in self.api.objects or self.api.objects[key].deleted:
            return None
        return dict(self.api.objects[key].last.raw)

    async def _prepare(self, running: RunningPod) -> Path:
        pod, folder = running.pod, running.folder
        spec = pod["spec"]
        folder.mkdir(parents=True, exist_ok=True)
        container = spec["containers"][0]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts: list[dict[str, Any]] = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                raise RuntimeError(f"volumeMount {mount['name']!r} names no volume of the pod")
            mounts.append(await self._volume(running, volume, mount))
        if spec.get("automountServiceAccountToken", True):
            mounts.append(self._service_account(running))
        termination = folder / "termination-log"
        termination.write_text("")
        mounts.append({"type": "file", "source": str(termination),
                       "target": container.get("terminationMessagePath", "/dev/termination-log")})
        home = folder / "home"
        home.mkdir(exist_ok=True)
        running.net = network.PodNetwork(self._free.pop(0))
        running.net.create(self._hosts_for(running))
        self._refresh_hosts()
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        if not argv:
            raise RuntimeError("the container has no command: this kubelet knows no image entrypoints")
        if argv[:2] == ["dtrain", "build-engine"] and "--fallback" not in argv:
            argv += ["--fallback", "onnxruntime"]  # no TensorRT, no GPU on this node (see the docstring)
        spec_file = folder / "podinit.json"
        spec_file.write_text(json.dumps({
            "hostname": spec.get("hostname") or running.name,
            "mounts": mounts,
            "workingDir": container.get("workingDir") or str(home),
            "argv": argv,
            "env": self._environment(running, container, home),
            "ledger": str(self.ledger),
            "devScratch": str(folder / "dev"),
        }, indent=1))
        return spec_file

    async def _volume(self, running: RunningPod, volume: dict[str, Any], mount: dict[str, Any]) -> dict[str, Any]:
        target = mount["mountPath"]
        read_only = bool(mount.get("readOnly"))
        if "configMap" in volume:
            name = volume["configMap"]["name"]
            deadline = time.monotonic() + 60
            while (config_map := self._configmap(running.namespace, name)) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f'configmap "{name}" not found')
                await asyncio.sleep(0.1)
            folder = running.folder / "volumes" / volume["name"]
            folder.mkdir(parents=True, exist_ok=True)
            for key, value in (config_map.get("data") or {}).items():
                (folder / key).write_text(value)
            return {"type": "bind", "source": str(folder), "target": target, "readOnly": True}
        if "emptyDir" in volume:
            if (volume["emptyDir"] or {}).get("medium") == "Memory":
                return {"type": "tmpfs", "target": target}
            folder = running.folder / "volumes" / volume["name"]
            folder.mkdir(parents=True, exist_ok=True)
            return {"type": "bind", "source": str(folder), "target": target, "readOnly": read_only}
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            folder = self.claim_folder(running.namespace, claim)
            return {"type": "bind", "source": str(folder), "target": target, "readOnly": read_only}
        raise RuntimeError(f"volume {volume['name']!r}: this kubelet mounts configMap, emptyDir and "
                           f"persistentVolumeClaim volumes only, not {sorted(volume)}")

    def claim_folder(self, namespace: str, claim: str) -> Path:
        folder = self.storage / namespace / claim
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _service_account(self, running: RunningPod) -> dict[str, Any]:
        account = running.pod["spec"].get("serviceAccountName") or "default"
        folder = running.folder / "serviceaccount"
        folder.mkdir(exist_ok=True)
        (folder / "token").write_text(self.token_for(running.namespace, account))
        (folder / "namespace").write_text(running.namespace)
        (folder / "ca.crt").write_bytes(self.ca_file.read_bytes())
        return {"type": "bind", "source": str(folder), "target": SERVICE_ACCOUNT_DIR, "readOnly": True}

    def _field(self, running: RunningPod, path: str) -> str:
        meta, spec = running.pod["metadata"], running.pod["spec"]
        values = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "spec.nodeName": NODE_NAME,
            "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
            "status.podIP": running.net.address if running.net else "",
            "status.hostIP": network.NODE_ADDRESS,
        }
        if path in values:
            return values[path]
        if path.startswith(("metadata.labels['", "metadata.annotations['")):
            kind, key = path.split("['", 1)
            return (meta.get(kind.split(".")[1]) or {}).get(key.rstrip("']"), "")
        raise RuntimeError(f"fieldRef {path!r} is not supported by this kubelet")

    def _environment(self, running: RunningPod, container: dict[str, Any], home: Path) -> dict[str, str]:
        env = {
            "PATH": f"{self.env_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home),
            "HOSTNAME": running.pod["spec"].get("hostname") or running.name,
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "KUBERNETES_SERVICE_HOST": network.NODE_ADDRESS,
            "KUBERNETES_SERVICE_PORT": str(API_PORT),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(API_PORT),
            "KUBERNETES_PORT": f"tcp://{network.NODE_ADDRESS}:{API_PORT}",
        }
        for name in ("OMP_NUM_THREADS", "PYTHONPATH"):
            if os.environ.get(name):
                env[name] = os.environ[name]
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = str(var["value"])
            elif "fieldRef" in (var.get("valueFrom") or {}):
                env[var["name"]] = self._field(running, var["valueFrom"]["fieldRef"]["fieldPath"])
            elif "valueFrom" in var:
                raise RuntimeError(f"env {var['name']}: only value and fieldRef are supported by this kubelet")
            else:
                env[var["name"]] = ""
        return env

    def _hosts_for(self, running: RunningPod) -> str:
        entries = []
        for other in self.pods.values():
            if other.namespace == running.namespace and other.net is not None and not other.finished:
                entries.append((other.net.address, network.pod_names(other.pod)))
        own = running.pod["spec"].get("hostname") or running.name
        return network.hosts_file((own, running.net.address if running.net else "127.0.0.1"), entries)

    def _refresh_hosts(self) -> None:
        for other in self.pods.values():
            if other.net is not None and not other.finished:
                other.net.write_hosts(self._hosts_for(other))

    # --- Deletion ---------------------------------------------------------------------------------

    async def _terminate(self, running: RunningPod, given: int | None = None) -> None:
        """SIGTERM to the container's main process; SIGKILL to the pod after its grace period."""
        grace = given if given is not None else running.pod["spec"].get("terminationGracePeriodSeconds")
        grace = DEFAULT_GRACE_SECONDS if grace is None else int(grace)
        while running.process is None and not running.finished:
            await asyncio.sleep(0.05)  # still being set up: the runtime starts it, then stops it
        pid = running.container_pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while not running.finished and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if not running.finished:
            self._kill_all(running)

    def _kill_all(self, running: RunningPod) -> None:
        for pid in running.all_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    # --- What the scenarios use ------------------------------------------------------------------

    def running(self, namespace: str, name: str) -> RunningPod | None:
        """The live incarnation of a pod, by name."""
        for pod in self.pods.values():
            if pod.namespace == namespace and pod.name == name and not pod.finished and pod.process is not None:
                return pod
        return None

    def processes(self, namespace: str, prefix: str) -> list[int]:
        """Every live host PID of the pods whose name starts with `prefix`."""
        return [pid for pod in self.pods.values() if pod.namespace == namespace and pod.name.startswith(prefix)
                for pid in pod.all_pids()]


class JobController:
    """batch/v1 Jobs: one pod at a time from the template; Complete, or Failed past backoffLimit."""

    def __init__(self, api: Any, request: Callable[..., Any]) -> None:
        self.api = api
        self.request = request
        self._task: asyncio.Task | None = None
        self._seen: dict[str, dict[str, Any]] = {}

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            try:
                await self.sync()
            except Exception:
                log.exception("job controller sync failed")
            await asyncio.sleep(SYNC_SECONDS)

    def _objects(self, resource: Any) -> list[dict[str, Any]]:
        return [dict(obj.last.raw) for (res, _, _), obj in list(self.api.objects.items())
                if res == resource and not obj.deleted]

    async def sync(self) -> None:
        pods = self._objects(PODS)
        for job in self._objects(JOBS):
            meta, spec, status = job["metadata"], job["spec"], job.get("status") or {}
            if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                   for c in status.get("conditions") or []):
                continue
            if spec.get("suspend"):
                continue
            mine = [p for p in pods if any(r.get("uid") == meta["uid"] for r in p["metadata"].get("ownerReferences") or [])]
            phases = [(p.get("status") or {}).get("phase") for p in mine]
            succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
            active = len(mine) - succeeded - failed
            now = now_rfc3339()
            path = f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs/{meta['name']}/status"
            if succeeded:
                await self.request("PATCH", path, {"status": {
                    "succeeded": succeeded, "failed": failed, "active": 0, "completionTime": now,
                    "conditions": [
                        {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                        {"type": "Complete", "status": "True", "lastTransitionTime": now},
                    ]}}, "application/merge-patch+json")
                continue
            if failed > int(spec.get("backoffLimit", 6)):
                message = "Job has reached the specified backoff limit"
                await self.request("PATCH", path, {"status": {
                    "failed": failed, "active": 0,
                    "conditions": [
                        {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
                         "message": message, "lastTransitionTime": now},
                        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                         "message": message, "lastTransitionTime": now},
                    ]}}, "application/merge-patch+json")
                continue
            if active == 0:
                await self._create_pod(job)
            if status.get("active") != max(active, 1) or status.get("failed", 0) != failed:
                await self.request("PATCH", path, {"status": {"active": max(active, 1), "failed": failed,
                                                              "startTime": status.get("startTime") or now}},
                                   "application/merge-patch+json")

    async def _create_pod(self, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        template = job["spec"]["template"]
        labels = {**(template.get("metadata") or {}).get("labels", {}),
                  "batch.kubernetes.io/job-name": meta["name"], "batch.kubernetes.io/controller-uid": meta["uid"]}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{secrets.token_hex(3)[:5]}",
                "namespace": meta["namespace"],
                "labels": labels,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                     "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": template["spec"],
        }
        await self.request("POST", f"/api/v1/namespaces/{meta['namespace']}/pods", pod, "application/json")
