"""Leader election over a coordination.k8s.io/v1 Lease, as kube-controller-manager does it.

Several operator replicas may run; one holds the Lease and reconciles, the others wait. The
timing is client-go's, with its flags' names and defaults:

- lease duration (15 s): how long a standby waits, after it last saw the Lease change, before it
  takes the Lease over. It counts on its own clock from when it saw the change, not from the
  time written in the Lease, so that clock skew between nodes does not matter;
- renew deadline (10 s): how long the leader keeps trying to renew before it gives up;
- retry period (2 s): how often candidates try to acquire and the leader renews.

A leader that cannot renew within the renew deadline stands down: it acts no more, and keeps trying.
It must not act next to a new leader, which may take the Lease a lease duration after its last
renewal; but a short API server outage (which no other candidate can use either) does not end it: once
it renews the Lease it held all along, it acts again, with no restart. A leader that finds the Lease
held by another, or finds that another held it meanwhile, exits at once (as kube-controller-manager
does), and its Deployment starts it again as a standby. On a clean stop it releases the Lease, so that a
standby takes over within a retry period instead of a lease duration.

The Lease is written with merge patches that carry its resourceVersion (the API server refuses
them with 409 when the Lease changed meanwhile), so two candidates never both win.

Why not kopf's own: kopf's peering is not leader election. It needs kopf's own KopfPeering
resources (a CRD installed beside the operator's, cluster-wide for a cluster-wide operator), and a
replica that sees a peer of the same or higher priority pauses, with no lease to fence a replica
that lost its network and goes on writing. A Lease needs no CRD, is what `kubectl get lease` and
every Kubernetes controller use, and gives the measured failover: `make e2e` scenario
`leader-failover`, the leader's pod lost → the standby leads in 11.2 s (lease duration 10 s),
rank 0's progress in the status again through it at 13.0 s, no gang restart (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from dtrain_operator.controller.kube import ApiError, KubeClient

logger = logging.getLogger(__name__)

API_VERSION = "coordination.k8s.io/v1"
KIND = "Lease"
JITTER = 1.2
"""A candidate's retry waits between 1 and 1.2 retry periods (client-go's JitterFactor)."""


@dataclass(frozen=True)
class LeaderElectionConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def check(self) -> str | None:
        """What is wrong with the timing, as client-go checks it, or None."""
        if self.retry_period <= 0:
            return "--leader-elect-retry-period must be above 0"
        if self.renew_deadline <= JITTER * self.retry_period:
            return "--leader-elect-renew-deadline must be more than 1.2 x --leader-elect-retry-period"
        if self.lease_duration <= self.renew_deadline:
            return "--leader-elect-lease-duration must be more than --leader-elect-renew-deadline"
        return None


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate for the Lease."""

    def __init__(self, config: LeaderElectionConfig, client: KubeClient) -> None:
        self.config = config
        self._client = client
        self._observed: dict[str, Any] | None = None
        self._observed_at = 0.0
        self.leading = False

    def use_client(self, client: KubeClient) -> None:
        """A client of the event loop the elector runs in now."""
        self._client = client

    @property
    def holder(self) -> str:
        return str((self._observed or {}).get("holderIdentity") or "")

    def _spec(self, now: datetime, earlier: dict[str, Any]) -> dict[str, Any]:
        mine = earlier.get("holderIdentity") == self.config.identity
        transitions = int(earlier.get("leaseTransitions") or 0)
        return {
            "holderIdentity": self.config.identity,
            "leaseDurationSeconds": max(round(self.config.lease_duration), 1),
            "acquireTime": earlier.get("acquireTime") if mine and earlier.get("acquireTime") else _micro_time(now),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions if mine or not earlier else transitions + 1,
        }

    def _observe(self, spec: dict[str, Any]) -> None:
        if spec != self._observed:
            self._observed = dict(spec)
            self._observed_at = time.monotonic()

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this candidate holds the Lease afterwards."""
        cfg = self.config
        now = datetime.now(timezone.utc)
        try:
            lease = await self._client.get(API_VERSION, KIND, cfg.namespace, cfg.name)
        except ApiError as exc:
            if not exc.not_found:
                raise
            spec = self._spec(now, {})
            body = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": spec,
            }
            try:
                await self._client.create(body)
            except ApiError as create_error:
                if create_error.conflict:
                    return False  # another candidate created it first
                raise
            self._observe(spec)
            return True
        spec = dict(lease.get("spec") or {})
        self._observe(spec)
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        if holder and holder != cfg.identity and time.monotonic() < self._observed_at + duration:
            return False
        new = self._spec(now, spec)
        patch = {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]}, "spec": new}
        try:
            await self._client.patch(API_VERSION, KIND, cfg.namespace, cfg.name, patch)
        except ApiError as exc:
            if exc.conflict:
                return False  # changed meanwhile: someone else renewed or took it
            raise
        self._observe(new)
        return True

    async def acquire(self) -> None:
        """Wait until this candidate holds the Lease."""
        cfg = self.config
        reported = ""
        while True:
            try:
                if await self.try_acquire_or_renew():
                    self.leading = True
                    logger.info("leader election: %s acquired the lease %s/%s", cfg.identity, cfg.namespace, cfg.name)
                    return
            except ApiError as exc:
                logger.warning("leader election: cannot read or write the lease %s/%s: %s", cfg.namespace, cfg.name, exc)
            if self.holder and self.holder != reported:
                reported = self.holder
                logger.info("leader election: %s/%s is held by %s; standing by", cfg.namespace, cfg.name, reported)
            await asyncio.sleep(cfg.retry_period * random.uniform(1.0, JITTER))

    async def keep(
        self, on_lost: Callable[[str], None], on_paused: Callable[[str], None], on_resumed: Callable[[], None]
    ) -> None:
        """Renew the Lease every retry period. Past the renew deadline without a renewal (the API server out of
        reach) the leader stands down: `on_paused`, it acts no more (`leading` is False) and keeps trying. Once it
        renews the Lease it held all along (no other candidate acquired it meanwhile: the same acquire time), it
        leads again: `on_resumed`. A Lease another holds, or took meanwhile, ends its leadership: `on_lost`, once."""
        cfg = self.config
        renewed = time.monotonic()
        acquired: object = None
        while True:
            await asyncio.sleep(cfg.retry_period)
            try:
                if await self.try_acquire_or_renew():
                    renewed = time.monotonic()
                    now_acquired = (self._observed or {}).get("acquireTime")
                    if not self.leading:
                        if now_acquired != acquired:
                            on_lost("the lease was another candidate's while the API server was out of reach")
                            return
                        self.leading = True
                        on_resumed()
                    acquired = now_acquired
                    continue
                why = f"the lease is held by {self.holder or 'another candidate'}"
                self.leading = False
                on_lost(why)
                return
            except ApiError as exc:
                logger.warning("leader election: renewing the lease failed: %s", exc)
            if self.leading and time.monotonic() - renewed > cfg.renew_deadline:
                self.leading = False
                on_paused(f"the lease could not be renewed within {cfg.renew_deadline:g} s")

    async def release(self) -> None:
        """Give the Lease up (a clean stop), so that a standby takes over at its next retry."""
        if not self.leading:
            return
        self.leading = False
        cfg = self.config
        try:
            lease = await self._client.get(API_VERSION, KIND, cfg.namespace, cfg.name)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != cfg.identity:
                return
            released = {
                "holderIdentity": None,
                "leaseDurationSeconds": 1,
                "renewTime": _micro_time(datetime.now(timezone.utc)),
            }
            patch = {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]}, "spec": released}
            await self._client.patch(API_VERSION, KIND, cfg.namespace, cfg.name, patch)
            logger.info("leader election: released the lease %s/%s", cfg.namespace, cfg.name)
        except ApiError as exc:
            logger.warning("leader election: could not release the lease: %s", exc)
