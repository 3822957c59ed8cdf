"""A leader through an API server outage (controller/leader.py): it stands down past the renew deadline, keeps
trying, and leads again once it renews the Lease it held all along, with no restart; a Lease another candidate
held meanwhile ends its leadership. The Lease lives in a table here, as the API server would keep it (its
resourceVersion checked); the outage is the table refusing every request."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from dtrain_operator.controller.kube import ApiError
from dtrain_operator.controller.leader import LeaderElectionConfig, LeaderElector

CONFIG = LeaderElectionConfig("dtrain-system", "dtrain-operator", "replica-a", lease_duration=0.6, renew_deadline=0.3,
                              retry_period=0.05)


class Leases:
    """One Lease, read and written as the API server does (merge patches checked against resourceVersion)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.out = False

    def _answer(self) -> None:
        if self.out:
            raise ApiError(0, "ConnectionRefused", "the API server is out of reach")

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        self._answer()
        if self.lease is None:
            raise ApiError(404, "NotFound", "no lease")
        return copy.deepcopy(self.lease)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        self._answer()
        self.version += 1
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        return copy.deepcopy(self.lease)

    async def patch(self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self._answer()
        assert self.lease is not None
        if patch["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the lease changed")
        self.version += 1
        self.lease["spec"] = {**self.lease["spec"], **patch["spec"]}
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


async def until(condition: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def leading(leases: Leases) -> tuple[LeaderElector, list[str], asyncio.Task[None]]:
    elector = LeaderElector(CONFIG, leases)  # type: ignore[arg-type]
    await elector.acquire()
    said: list[str] = []
    task = asyncio.create_task(elector.keep(lambda why: said.append(f"lost: {why}"),
                                            lambda why: said.append(f"paused: {why}"), lambda: said.append("resumed")))
    await until(lambda: leases.version >= 3)  # renewed at least twice
    return elector, said, task


async def test_an_outage_pauses_the_leader_and_it_leads_again_after():
    leases = Leases()
    elector, said, task = await leading(leases)
    leases.out = True
    await until(lambda: said == ["paused: the lease could not be renewed within 0.3 s"])
    assert not elector.leading
    leases.out = False
    await until(lambda: said[-1:] == ["resumed"])
    assert elector.leading and not task.done()
    task.cancel()


async def test_a_lease_another_held_meanwhile_ends_the_leadership():
    leases = Leases()
    elector, said, task = await leading(leases)
    leases.out = True
    await until(lambda: said[-1:] and said[-1].startswith("paused"))
    # Another candidate took the Lease and gave it up while this one could not reach the API server.
    assert leases.lease is not None
    leases.lease["spec"] = {**leases.lease["spec"], "holderIdentity": None, "acquireTime": "2026-12-06T00:00:00.000000Z"}
    leases.out = False
    await asyncio.wait_for(task, 10)
    assert said[-1] == "lost: the lease was another candidate's while the API server was out of reach"
    assert not elector.leading
