"""The API servers bench/operator_scale.py runs the operator against: what it needs of one (ApiUnderTest),
the operator tests' emulator, timed (TimedApiServer, EmulatedApi; the real one is control_plane.RealApi),
and the sampler of a process's CPU time and memory."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import attrs
import psutil

from dtrain_operator.api import contract
from tests.operator.apiserver import ApiServer
from tests.operator.cluster import Cluster
from tests.operator.operator_process import OPERATOR_AGENTS, OperatorProcess


@attrs.define(kw_only=True)
class TimedApiServer(ApiServer):
    """The test API server, noting when each object was first stored and each job first reached a phase."""

    added_at: dict[tuple[str, str | None, str], float] = attrs.field(factory=dict, init=False)
    phase_at: dict[tuple[str | None, str, str], float] = attrs.field(factory=dict, init=False)
    job_events: int = attrs.field(default=0, init=False)

    def _emit(self, event_type: str, resource: Any, raw: dict[str, Any]) -> None:
        now = time.monotonic()
        meta = raw.get("metadata") or {}
        key = (resource.plural, meta.get("namespace"), meta.get("name", ""))
        if resource.plural in (contract.PLURAL, "pods"):
            self.job_events += 1
        if event_type == "ADDED":
            self.added_at.setdefault(key, now)
        if resource.plural == contract.PLURAL:
            phase = (raw.get("status") or {}).get("phase")
            if phase:
                self.phase_at.setdefault((meta.get("namespace"), meta.get("name", ""), phase), now)
        super()._emit(event_type, resource, raw)


class ApiUnderTest(Protocol):
    """What the benchmark needs of the API server the operator runs against."""

    kind: str  # "real" or "emulator"
    label: str  # what it is, for the table
    added_at: dict[tuple[str, str | None, str], float]  # (plural, namespace, name): when it first appeared
    phase_at: dict[tuple[str | None, str, str], float]  # (namespace, name, phase): when a job first had it
    watch_restarts: int  # the benchmark's watches, ended by the server and resumed

    @property
    def job_events(self) -> int:
        """Watch events of the jobs and their pods so far: each one a handler call for an operator
        that reconciles on every event (kopf's handlers, without dtrain's work queue)."""
        ...

    def check(self) -> None:
        """Raise what failed on the benchmark's side of the server (a watch), if anything did."""
        ...

    async def start_operator(self, args: tuple[str, ...]) -> OperatorProcess: ...

    async def create(self, obj: dict[str, Any]) -> None: ...

    async def run_pod(self, namespace: str, name: str) -> None: ...

    def operator_requests(self) -> list[str]:
        """Every request of the operator so far, in order, as "verb resource[/subresource]", Leases aside."""
        ...

    def start_cpu_clock(self) -> None: ...

    def server_cpu_seconds(self) -> dict[str, float]:
        """CPU seconds since start_cpu_clock of what serves the API (and of the benchmark)."""
        ...


class EmulatedApi:
    """The API emulator of the operator's tests, served from this process, with its recorder."""

    kind = "emulator"
    label = "the API emulator of the operator's tests (tests/operator/apiserver.py, kmock), in the benchmark's process"

    def __init__(self, server: TimedApiServer, workdir: Path) -> None:
        self.server = server
        self.cluster = Cluster(server, workdir)
        self.added_at = server.added_at
        self.phase_at = server.phase_at
        self.watch_restarts = 0  # it notes arrivals as it stores them: the benchmark holds no watch
        self._process = ProcessSampler(psutil.Process().pid)
        self._cpu_at_start = 0.0

    @property
    def job_events(self) -> int:
        return self.server.job_events

    def check(self) -> None:
        pass

    async def start_operator(self, args: tuple[str, ...]) -> OperatorProcess:
        return await self.cluster.start_operator(*args)

    async def create(self, obj: dict[str, Any]) -> None:
        await self.cluster.create(obj)

    async def run_pod(self, namespace: str, name: str) -> None:
        await self.cluster.run(namespace, name)

    def operator_requests(self) -> list[str]:
        return [
            f"{call.verb} {call.rbac_resource}"
            for agent, call in self.server.calls
            if agent.startswith(OPERATOR_AGENTS) and call.resource != "leases"
        ]

    def start_cpu_clock(self) -> None:
        self._cpu_at_start = self._process.cpu_seconds()

    def server_cpu_seconds(self) -> dict[str, float]:
        return {"API emulator and benchmark (one process)": self._process.cpu_seconds() - self._cpu_at_start}


class ProcessSampler:
    """Peak RSS (the kernel's high-water mark) and CPU time of one process."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)

    def cpu_seconds(self) -> float:
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def peak_rss_mib(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float(self.process.memory_info().rss) / 2**20

    def rss_mib(self) -> float:
        return float(self.process.memory_info().rss) / 2**20
