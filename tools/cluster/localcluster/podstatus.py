"""A pod's status as a kubelet's status manager writes it: the container status, the conditions, the
termination message, and the patches, sent until the API server takes them."""

from __future__ import annotations

import asyncio
from typing import Any

from .api import Api, ApiError
from .podrun import PodRun, now

LOG_TAIL_LINES = 80

LOG_TAIL_BYTES = 2048


def status_patch(status: dict[str, Any]) -> dict[str, Any]:
    """A strategic merge patch of the kubelet's part of a pod's status: its conditions merge by type, so that
    those of others stay (the eviction API's DisruptionTarget, Kueue's TerminationTarget), as a kubelet's
    status manager keeps them; its container statuses replace the old ones whole."""
    patch = dict(status)
    if "containerStatuses" in patch:
        patch["containerStatuses"] = [*patch["containerStatuses"], {"$patch": "replace"}]
    return patch


def container_statuses(run: PodRun, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's one container status, in `state` (waiting, running or terminated)."""
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


def pod_conditions(run: PodRun, initialized: bool) -> list[dict[str, Any]]:
    """The pod's conditions: scheduled, initialized as said, and ready as its container is."""
    stamp = now()
    ready = "True" if run.ready else "False"
    return [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
        {"type": "Initialized", "status": "True" if initialized else "False", "lastTransitionTime": stamp},
        {"type": "ContainersReady", "status": ready, "lastTransitionTime": stamp},
        {"type": "Ready", "status": ready, "lastTransitionTime": stamp},
    ]


def termination_message(run: PodRun, code: int) -> str:
    """The container's termination message: its termination-log, or, with FallbackToLogsOnError and a failure,
    the tail of its log."""
    path = run.folder / "termination-log"
    text = path.read_text(errors="replace") if path.exists() else ""
    if not text.strip() and code != 0 and run.container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        log_text = (run.folder / "container.log").read_text(errors="replace")
        text = "\n".join(log_text.splitlines()[-LOG_TAIL_LINES:])[-LOG_TAIL_BYTES:]
    return text[-4096:]


class StatusManager:
    """The pods' status patches through the node's client of the API server."""

    def __init__(self, api: Api) -> None:
        self.api = api

    async def patch(self, run: PodRun, status: dict[str, Any]) -> None:
        """The pod's status, as the kubelet's status manager keeps it: the newest value of each field is
        sent, again and again while the API server does not answer; a pod deleted meanwhile is left be."""
        run.pending_status.update(status)
        if run.status_sender is None or run.status_sender.done():
            run.status_sender = asyncio.create_task(self._send(run))

    async def _send(self, run: PodRun) -> None:
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

    async def waiting(self, run: PodRun, reason: str, message: str) -> None:
        """The container waiting, for `reason`: said once, and again only when the reason or message change."""
        if run.waiting == {"reason": reason, "message": message}:
            return
        run.waiting = {"reason": reason, "message": message}
        await self.patch(run, {"phase": "Pending", "conditions": pod_conditions(run, True),
                               "containerStatuses": container_statuses(run, {"waiting": run.waiting})})
