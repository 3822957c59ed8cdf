"""Carrying out a plan (core.child_plan): deletions first, then creations, every call safe to repeat.

Each child gets its owner reference here (`adopt`), and a child whose name is taken by an object this
job does not own is never adopted: it is a ChildConflict. What was written is remembered in the job's
Expectations until the watch shows it. Before a job is accepted, its children go to the API server as a
dry run (core.server_check), so that one it refuses fails the job before anything runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar, cast

import kopf

from dtrain_operator.api import DistributedTraining, contract
from dtrain_operator.api.reasons import event
from dtrain_operator.controller import refusals
from dtrain_operator.controller.expectations import EXPECTATION_TTL_SECONDS, Expectations
from dtrain_operator.controller.kube import ApiError, KubeClient
from dtrain_operator.core import (
    child_names,
    engine_job,
    in_place,
    launch_env,
    queueing,
    render,
    server_check,
    standby,
)
from dtrain_operator.core.child_plan import Plan
from dtrain_operator.core.observation import JobKey, PodObservation
from dtrain_operator.core.status.observe import controller_uid, observe_engine_job, observe_pod

logger = logging.getLogger(__name__)
T = TypeVar("T")


class ChildConflict(Exception):
    """A child's name is taken by an object this job does not own."""


EVENT_CHILD_CONFLICT = event(
    "ChildConflict", "Warning", "an object with the name of one of the job's children exists and is not the job's "
    "(left by an earlier job of the same name?): nothing starts until it goes", "delete it, or rename the job",
)


class ChildWriter:
    """Creates and deletes one operator's children through its client."""

    def __init__(self, client: KubeClient, network_policy: bool, report: launch_env.ReportEndpoint | None = None) -> None:
        self._client = client
        self._network_policy = network_policy  # a NetworkPolicy per job: ingress only from its own pods
        self._report = report  # where rank 0 reports (the operator's report Service); None: reports off

    async def carry_out(
        self,
        key: JobKey,
        body: Mapping[str, Any],
        job: DistributedTraining,
        generation: int,
        plan: Plan,
        blocked: frozenset[str],
        expectations: Expectations,
        service_known: bool = False,
    ) -> None:
        """Deletions first, then creations; every call is safe to repeat. `service_known`: the watch shows the job's
        Service, owned by it (nothing to create or read)."""
        namespace, name = key
        await gather(
            *(self._delete_pod(namespace, pod, expectations, plan.delete_grace_seconds) for pod in plan.delete_pods)
        )
        await self._force_delete(key, plan.force_delete_pods, expectations)
        await gather(*(self._patch_pod(namespace, pod, queueing.last_in_group_patch(pod.uid)) for pod in plan.let_go_pods))
        if plan.relabel_pods:
            await gather(*(self._patch_pod(namespace, pod, in_place.relabel_patch(generation, pod.uid))
                           for pod in plan.relabel_pods))
            logger.info("%s/%s: every supervisor stopped torchrun; %d pod(s) restart in place as gang generation %d",
                        namespace, name, len(plan.relabel_pods), generation)
        if plan.delete_engine_job is not None:
            await self._delete(
                "batch/v1", "Job", namespace, plan.delete_engine_job.name, plan.delete_engine_job.uid, "Background"
            )
        ranks = [rank for rank in plan.create_ranks if child_names.worker_pod_name(job, rank, generation) not in blocked]
        if ranks:
            pods = [render.render_worker_pod(job, rank, generation, self._report, plan.gang_nodes) for rank in ranks]
            adopt(pods, body)
            await self._ensure_shared_children(body, job, generation, expectations, service_known)
            await gather(*(self._create_pod(pod, expectations) for pod in pods))
            logger.info("%s/%s: created %d worker pod(s) of gang generation %d", namespace, name, len(pods), generation)
        if plan.create_standby_ranks:
            standby_pods = [standby.render_standby_pod(job, rank) for rank in plan.create_standby_ranks]
            adopt(standby_pods, body)
            await gather(*(self._create_pod(pod, expectations) for pod in standby_pods))
            logger.info("%s/%s: created %d standby pod(s) for the node(s) the elastic gang lacks", namespace, name,
                        len(standby_pods))
        if len(ranks) < len(plan.create_ranks):
            raise ChildConflict(
                "worker pod names are taken by pods this job does not own (left by an earlier job of the same "
                "name?); waiting for them to go"
            )
        if plan.create_engine_job:
            engine = engine_job.render_engine_job(job)
            adopt([engine], body)
            created, _ = await self._create_owned(engine, expectations.uid)
            expectations.engine_job = (time.monotonic(), observe_engine_job(created))
            logger.info("%s/%s: created the engine Job %s", namespace, name, engine["metadata"]["name"])
        if plan.delete_job:
            logger.info("%s/%s: ttlSecondsAfterFinished has passed; deleting the job", namespace, name)
            await self._delete(contract.API_VERSION, contract.KIND, namespace, name, expectations.uid, "Background")

    async def server_refusals(self, body: Mapping[str, Any], job: DistributedTraining) -> list[str]:
        """The API server's refusals of the children the job would get (server_check.py), asked for once,
        before the job is accepted: nothing is created. A 5xx or a lost connection fails the reconcile (retried)."""
        children = server_check.run_children(job, self._report)
        adopt(children, body)

        async def verdict(child: dict[str, Any]) -> str | None:
            try:
                await self._client.create(child, dry_run=True)
            except ApiError as exc:
                if exc.status == 0 or exc.status >= 500:
                    raise
                return server_check.dry_run_refusal(child, exc.status, exc.message)
            return None

        return [refusal for refusal in await gather(*(verdict(child) for child in children)) if refusal]

    async def _ensure_shared_children(
        self,
        body: Mapping[str, Any],
        job: DistributedTraining,
        generation: int,
        expectations: Expectations,
        service_known: bool,
    ) -> None:
        """The Service (and PodGroup, NetworkPolicy) the pods need, known to be this job's before any pod is
        created: a Service of the same name left by someone else would not give its pods their DNS names.
        Once per gang generation, so that one deleted by hand is back for the next gang: a Service the watch shows
        is not asked for; for a gang after the first the others are read first, and created only when gone (an
        operator that has just taken over the job too)."""
        if expectations.shared_children_for == generation:
            return
        made_sure = expectations.shared_children_for is not None or generation > 0
        children = [child for child in server_check.shared_children(job, self._network_policy)
                    if not (service_known and child["kind"] == "Service")]
        adopt(children, body)
        await gather(*(self._create_owned(child, expectations.uid, read_first=made_sure) for child in children))
        expectations.shared_children_for = generation

    async def _create_owned(self, obj: dict[str, Any], owner_uid: str, read_first: bool = False) -> tuple[dict[str, Any], bool]:
        """Create a child; if it exists already it must be this job's (then it is adopted as is)."""
        try:
            existing, created = await self._client.create_or_read(obj, read_first)
        except ApiError as exc:
            meta = obj["metadata"]
            refusal = refusals.classify(
                obj["kind"], f"{meta['namespace']}/{meta['name']}", exc.status, exc.message, obj["apiVersion"]
            )
            if refusal is None:
                raise
            raise refusals.CreateRefused(refusal) from exc
        if not created and controller_uid(existing.get("metadata") or {}) != owner_uid:
            meta = obj["metadata"]
            raise ChildConflict(
                f"{obj['kind']} {meta['namespace']}/{meta['name']} exists and is not owned by this job; "
                "delete it or rename the job"
            )
        return existing, created

    async def _force_delete(self, key: JobKey, stuck: Sequence[PodObservation], expectations: Expectations) -> None:
        """Each stuck pod force-deleted once per expectation TTL, not at every reconcile."""
        now = time.monotonic()
        forced = [p for p in stuck
                  if now - expectations.forced_pods.get(p.uid, -EXPECTATION_TTL_SECONDS) >= EXPECTATION_TTL_SECONDS]
        for pod in forced:
            logger.warning("%s/%s: %s is stuck terminating and its node stopped reporting; force-deleting it",
                           *key, pod.name)
            expectations.forced_pods[pod.uid] = now
        await gather(*(self._delete_pod(key[0], pod, expectations, grace_seconds=0) for pod in forced))

    async def _create_pod(self, pod: dict[str, Any], expectations: Expectations) -> None:
        # A 409 then a 404 (the pod went between the two) fails this reconcile: it is retried.
        existing, _ = await self._create_owned(pod, expectations.uid)
        observation = observe_pod(existing)
        expectations.created_pods[observation.uid] = (time.monotonic(), observation)

    async def _patch_pod(self, namespace: str, pod: PodObservation, patch: Mapping[str, Any]) -> None:
        """A merge patch of a pod's metadata, its uid a precondition: one gone or replaced since is left alone."""
        try:
            await self._client.patch("v1", "Pod", namespace, pod.name, patch)
        except ApiError as exc:
            if not (exc.not_found or exc.conflict):
                raise

    async def _delete_pod(
        self, namespace: str, pod: PodObservation, expectations: Expectations, grace_seconds: int | None = None
    ) -> None:
        gone = await self._delete("v1", "Pod", namespace, pod.name, pod.uid, grace_seconds=grace_seconds)
        expectations.deleted_pods[pod.uid] = (time.monotonic(), gone)

    async def _delete(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        uid: str,
        propagation: str | None = None,
        grace_seconds: int | None = None,
    ) -> bool:
        """Delete one incarnation of an object. Returns True when it is known to be gone already."""
        try:
            await self._client.delete(
                api_version, kind, namespace, name, uid=uid, propagation=propagation, grace_seconds=grace_seconds
            )
        except ApiError as exc:
            # 404: gone. 409: the uid precondition failed, so that incarnation is gone too.
            if exc.not_found or exc.conflict:
                return True
            raise
        return False


def adopt(children: list[dict[str, Any]], body: Mapping[str, Any]) -> None:
    """The one place where children get their owner reference to the DistributedTraining
    (controller, blockOwnerDeletion): the garbage collector deletes them with it."""
    kopf.append_owner_reference(children, owner=kopf.Body(cast(kopf.RawBody, body)))


async def gather(*calls: Awaitable[T]) -> list[T]:
    """Run calls at once and return their results; when some fail, raise the first failure after all have finished."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast(list[T], results)
