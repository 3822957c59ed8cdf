"""One pod as this kubelet runs it: its record (PodRun), its processes, and its status as a kubelet's status
manager writes it (the container status, the conditions, the termination message, the patch)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import images, network
from .volumes import PodVolumes


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def child_pids(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def end_pid_namespace(pidfd: int) -> None:
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


async def pid1_fd(process: asyncio.subprocess.Process) -> int | None:
    """A pidfd of the pod's PID 1 (unshare's child: podinit, then the container's command), once forked."""
    for _ in range(500):
        children = child_pids(process.pid)
        if children:
            with contextlib.suppress(ProcessLookupError):
                return os.pidfd_open(int(children[0]))
        if process.returncode is not None:
            return None
        await asyncio.sleep(0.01)
    return None


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
                todo.extend(child_pids(pid))
        return found

    @property
    def container_pid(self) -> int | None:
        """PID 1 of the pod's PID namespace: the container's main process."""
        if self.process is None or self.process.returncode is not None:
            return None
        children = child_pids(self.process.pid)
        return children[0] if children else None


