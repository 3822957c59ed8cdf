"""Kubelet behaviour the lifecycle-edge tests need, beyond cluster.Cluster's kubelet. Each piece is
small, drives the API server over HTTP as a kubelet would, and touches no shared code:

- graceful termination: a deleted pod stays Terminating (Cluster.hold_termination) until its
  container has exited, as a kubelet holds it for terminationGracePeriodSeconds (30 s by
  default); `finish_termination` ends it (exit 143, SIGTERM) and lets the pod go; a pod on a
  node that is gone for good is never finished;
- a lost node: `node_lost` marks a pod not Ready, as the node controller does; held, it never goes
  unless force-deleted (the API server drops the hold on `gracePeriodSeconds: 0`, apiserver.py);
- image pulls that fail: `PullFlipper` flips a pod's waiting reason between ErrImagePull and
  ImagePullBackOff, as the kubelet's back-off does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from .apiserver import now_rfc3339
from .cluster import Cluster, container_status


async def hold_all(cluster: Cluster, namespace: str, pods: list[dict[str, Any]]) -> None:
    """From now on, deleting these pods leaves them Terminating until `finish_termination`."""
    for pod in pods:
        await cluster.hold_termination(namespace, pod["metadata"]["name"])


def terminating(cluster: Cluster, namespace: str, job: str) -> list[str]:
    """Names of the job's worker pods that are deleted but not gone."""
    return [p["metadata"]["name"] for p in cluster.pods(namespace, job) if p["metadata"].get("deletionTimestamp")]


async def finish_termination(cluster: Cluster, namespace: str, name: str, exit_code: int = 143) -> None:
    """The container exited (SIGTERM: 143) and the kubelet lets the pod go. A real server deletes a pod that
    failed or succeeded at once (no kubelet has anything to stop): then there is nothing to finish."""
    try:
        pod = cluster.pod(namespace, name)
    except KeyError:
        return
    now = now_rfc3339()
    terminated = {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed",
                  "startedAt": now, "finishedAt": now}
    await cluster._pod_status(
        namespace,
        name,
        {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": container_status(pod, {"terminated": terminated}, ready=False),
        },
    )
    await cluster.let_go(namespace, name)


async def pull_failing(
    cluster: Cluster, namespace: str, name: str, reason: str, message: str, scheduled_at: str = ""
) -> None:
    """The pod is scheduled (at `scheduled_at`, default now) and its trainer container waits on its image."""
    pod = cluster.pod(namespace, name)
    now = scheduled_at or now_rfc3339()
    await cluster._pod_status(
        namespace,
        name,
        {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": container_status(pod, {"waiting": {"reason": reason, "message": message}}, ready=False),
        },
    )


@contextlib.asynccontextmanager
async def pull_flipping(
    cluster: Cluster, namespace: str, names: list[str], period: float = 0.3
) -> AsyncIterator[list[int]]:
    """Flip the pods' waiting reason ErrImagePull <-> ImagePullBackOff every `period` seconds
    while the block runs. Yields a one-item list: the number of flips so far."""
    flips = [0]
    gone: set[str] = set()
    scheduled_at = now_rfc3339()
    image_message = 'failed to pull and unpack image "registry.example/missing:1": not found'

    async def flip() -> None:
        reasons = ("ErrImagePull", "ImagePullBackOff")
        while True:
            reason = reasons[flips[0] % 2]
            message = image_message if reason == "ErrImagePull" else 'Back-off pulling image "registry.example/missing:1"'
            for name in [n for n in names if n not in gone]:
                try:
                    await pull_failing(cluster, namespace, name, reason, message, scheduled_at)
                except KeyError:  # the pod was deleted: its kubelet has nothing more to report
                    gone.add(name)
                except AssertionError as exc:  # deleted between the read and the write
                    if ": 404 " not in str(exc):
                        raise
                    gone.add(name)
            flips[0] += 1
            await asyncio.sleep(period)

    task = asyncio.create_task(flip())
    try:
        yield flips
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def node_lost(cluster: Cluster, namespace: str, name: str) -> None:
    """The pod's node stopped reporting: the node controller marks the pod not Ready; it never terminates."""
    now = now_rfc3339()
    await cluster._pod_status(
        namespace,
        name,
        {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now},
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}]},
    )
