"""What the worker pods' supervisors last said (api.launches), and the orders they wait on (core.in_place).

The reports live in the leader's memory only: every supervisor reports again within
launches.POLL_SECONDS, so a new leader knows them all again by then, and until a pod has reported
the operator restarts its gang by recreating the pods. An order is computed from the job and the
status the last reconcile decided; a supervisor's request is held until that order changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterable
from datetime import datetime

from dtrain_operator.api import DistributedTraining, DistributedTrainingStatus
from dtrain_operator.api.launches import LaunchOrder, LaunchReport
from dtrain_operator.core import in_place
from dtrain_operator.core.observation import JobKey, PodObservation, SupervisorState


class Supervisors:
    """Every job's supervisor reports, the decision their orders follow from, and the requests waiting on it."""

    def __init__(self) -> None:
        self._states: dict[JobKey, dict[str, SupervisorState]] = {}
        self._decided: dict[JobKey, tuple[DistributedTraining, DistributedTrainingStatus]] = {}
        self._changed: dict[JobKey, asyncio.Event] = {}

    def report(self, key: JobKey, pod_uid: str, report: LaunchReport, now: datetime) -> bool:
        """Take a report; True when it says something new about the launch (the job is reconciled then)."""
        states = self._states.setdefault(key, {})
        earlier = states.get(pod_uid)
        if earlier is not None and report.sequence < earlier.report.sequence:
            return False  # overtaken by a newer one on another connection
        states[pod_uid] = SupervisorState(report, now)
        if earlier is None:
            return True
        before = earlier.report
        return (before.generation, before.state, before.exit_code) != (report.generation, report.state, report.exit_code)

    def attach(self, key: JobKey, workers: Iterable[PodObservation]) -> tuple[PodObservation, ...]:
        """The workers with their supervisors' latest reports; reports of pods no longer observed are dropped."""
        workers = tuple(workers)
        states = self._states.get(key, {})
        for uid in set(states) - {p.uid for p in workers}:
            del states[uid]
        return tuple(dataclasses.replace(p, supervisor=states.get(p.uid)) for p in workers)

    def decided(self, key: JobKey, job: DistributedTraining | None, status: DistributedTrainingStatus) -> None:
        """The job and the status a reconcile just wrote: the orders follow from them; waiting requests look again."""
        if job is None:
            self._decided.pop(key, None)
        else:
            self._decided[key] = (job, status)
        self.wake(key)

    def wake(self, key: JobKey) -> None:
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()

    def order(self, key: JobKey, pod: PodObservation) -> LaunchOrder | None:
        """What the pod's supervisor does now; None before the job's first decision (it keeps doing what it does)."""
        decided = self._decided.get(key)
        if decided is None:
            return None
        state = self._states.get(key, {}).get(pod.uid)
        return in_place.order(*decided, dataclasses.replace(pod, supervisor=state))

    async def changed(self, key: JobKey, timeout: float) -> None:
        """Return when the job is decided again or after `timeout` seconds."""
        event = self._changed.setdefault(key, asyncio.Event())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    def forget(self, key: JobKey) -> None:
        self._states.pop(key, None)
        self._decided.pop(key, None)
        self.wake(key)
