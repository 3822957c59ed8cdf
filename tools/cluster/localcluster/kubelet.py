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
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import images, layout, network, pki
from .api import Api
from .nodestatus import heartbeat, register
from .podlogs import LogServer
from .podrun import PodRun, end_pid_namespace, exit_code, now, pid1_fd
from .podsetup import container_environment, expand, field_value, hosts_for, own_volumes, pull
from .podstatus import StatusManager, container_statuses, pod_conditions, termination_message
from .probes import probe_readiness
from .securitycontext import container_user
from .volumes import PodVolumes, VolumeNotReady

log = logging.getLogger("localcluster.kubelet")

PODINIT = Path(__file__).with_name("podinit.py")
# How soon a changed ConfigMap or Secret reaches the pods that mount it (a real kubelet: its sync period,
# a minute by default, plus its cache's TTL).
VOLUME_SYNC_SECONDS = 10
DEFAULT_GRACE_SECONDS = 30
MAX_BACKOFF_SECONDS = 60


PODS_PER_NODE = 110


def _log_failure(task: asyncio.Task) -> None:
    """A pod's task that failed is a kubelet bug: said in the log, never silent."""
    if not task.cancelled() and task.exception() is not None:
        log.error("a pod's task failed", exc_info=task.exception())


@dataclass


class Kubelet:
    def __init__(self, node: layout.Node, cpu: str, memory: str, gpus: int, pods_from: str = "images") -> None:
        self.node = node
        self.pods_from = pods_from
        self.capacity = {"cpu": cpu, "memory": memory, "pods": str(PODS_PER_NODE)}
        if gpus:
            self.capacity["nvidia.com/gpu"] = str(gpus)
        self.cert, self.key = pki.client(f"{node.name}-client", f"system:node:{node.name}", "system:nodes")
        self.api = Api(self.cert, self.key)
        self.status = StatusManager(self.api)
        self.runs: dict[str, PodRun] = {}
        self.endpoint_slices: dict[str, dict[str, Any]] = {}
        self.free = list(range(2, 250))
        self.env_bin = Path(sys.executable).parent

    # --- The node ----------------------------------------------------------------------------------

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

    async def _lost(self, run: PodRun) -> None:
        await self.finish(run, 137, "ContainerStatusUnknown", "the kubelet restarted and lost the container")

    async def run_pod(self, run: PodRun) -> None:
        if len(run.pod["spec"]["containers"]) != 1 or run.pod["spec"].get("initContainers"):
            await self.finish(run, 128, "ContainerCannotRun", "this kubelet runs pods of exactly one container")
            return
        await self.status.patch(run, {
            "phase": "Pending", "hostIP": layout.BRIDGE_ADDRESS, "hostIPs": [{"ip": layout.BRIDGE_ADDRESS}],
            "conditions": pod_conditions(run, False),
            "containerStatuses": container_statuses(run, {"waiting": {"reason": "ContainerCreating"}}),
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
            await self.status.patch(run, {"conditions": pod_conditions(run, True), "containerStatuses":
                                          container_statuses(run, {"waiting": {"reason": "CrashLoopBackOff"}})})
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
        code = exit_code(run.process.returncode) if run.process and run.process.returncode is not None else 137
        await self.finish(run, code, "Completed" if code == 0 else "Error", termination_message(run, code))

    async def start_and_wait(self, run: PodRun, init: dict[str, Any]) -> int:
        """One start of the container: a fresh root from its image (as a runtime makes a new container),
        the user it runs as, podinit's spec, the process; until it exits."""
        root = None
        if not self.from_host(run):
            root = await asyncio.to_thread(images.mount_root, run.container["image"], run.root_name)
        user, refused = (None, None) if root is None else container_user(run.pod, run.container, run.image.user, root)
        if refused:
            await self.status.waiting(run, "CreateContainerConfigError", refused)
            while not run.terminating:
                await asyncio.sleep(1)
            return 128
        if user is not None:
            own_volumes(run, init["mounts"], user)
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
        container_init = await pid1_fd(run.process)
        run.waiting = {}
        run.started_at = now()
        probe = run.container.get("readinessProbe")
        run.ready = probe is None
        await self.status.patch(run, {
            "phase": "Running", "hostIP": layout.BRIDGE_ADDRESS, "podIP": run.net.address,
            "podIPs": [{"ip": run.net.address}], "startTime": run.pod.get("status", {}).get("startTime") or run.started_at,
            "conditions": pod_conditions(run, True),
            "containerStatuses": container_statuses(run, {"running": {"startedAt": run.started_at}}),
        })
        prober = asyncio.create_task(probe_readiness(run, probe, self.status)) if probe else None
        try:
            returncode = await run.process.wait()
        finally:
            if prober is not None:
                prober.cancel()
            if container_init is not None:
                end_pid_namespace(container_init)
        return exit_code(returncode)

    async def finish(self, run: PodRun, code: int, reason: str, message: str) -> None:
        stamp = now()
        terminated: dict[str, Any] = {"exitCode": code, "reason": reason, "startedAt": run.started_at or stamp,
                                      "finishedAt": stamp, "containerID": f"namespaces://{run.uid}-{run.restarts}"}
        if message:
            terminated["message"] = message
        run.ready = False
        policy = run.pod["spec"].get("restartPolicy", "Always")
        terminal = "Succeeded" if code == 0 and policy != "Always" else "Failed"
        await self.status.patch(run, {
            "phase": terminal, "conditions": pod_conditions(run, True),
            "containerStatuses": container_statuses(run, {"terminated": terminated}),
        })
        run.finished = True
        self.release(run)
        if run.terminating:
            await self._remove(run.namespace, run.name, run.uid)

    # --- Sandbox, volumes, environment -------------------------------------------------------------

    def from_host(self, run: PodRun) -> bool:
        """Whether the container runs from this machine's Python environment (PODS_FROM=host): the project's
        own images do; any other (Kueue's manager) runs from its image in the store either way."""
        return self.pods_from == "host" and images.is_project_image(run.container.get("image", ""))

    async def prepare(self, run: PodRun) -> dict[str, Any]:
        """Everything a start of the container needs, but its root filesystem (made at each start)."""
        spec, container, folder = run.pod["spec"], run.container, run.folder
        folder.mkdir(parents=True, exist_ok=True)
        await pull(run, self.from_host(run), self.status)
        assert run.image is not None
        run.net = network.PodNetwork(self.node, self.free.pop(0))
        run.net.create(hosts_for(run, self.endpoint_slices))
        volumes = run.volumes = PodVolumes(self.api, run.pod, folder, lambda path: field_value(run, self.node.name, path))
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
        environment = await container_environment(run, volumes, str(home) if host else "/", self.node.name, host, self.env_bin)
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

    def refresh_hosts(self) -> None:
        for run in self.runs.values():
            if run.net is not None and not run.finished:
                run.net.write_hosts(hosts_for(run, self.endpoint_slices))

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

    async def run(self) -> None:
        async with self.api:
            await register(self.api, self.node, self.capacity)
            runner = await LogServer(self.node, self.runs).start()
            try:
                await asyncio.gather(
                    heartbeat(self.api, self.node, self.capacity), self.watch_pods(), self.watch_endpoint_slices(), self.sync_volumes()
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
