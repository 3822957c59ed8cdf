"""The reconciler: one DistributedTraining at a time, level-triggered, from cached observations.

kopf watches DistributedTrainings, worker/engine pods and engine Jobs (server-side label
selectors) and keeps the latter two in its indexes; every event queues the owning job here.
A queued job is reconciled by one worker at a time: its status is computed (status.py) from the
operator's own record of the job (trusted.py, never from what the status says) and patched when
it differs, Events are posted, the record is updated, then the plan (plan.py) is carried out:
deletions, then creations. A status or record that cannot be read is reported and nothing is
carried out. No list call is made per reconcile; only the Lease holder reconciles (leader.py).

The watch lags behind the operator's own writes, so the writes are remembered until the watch
shows them (as Kubernetes controllers' "expectations"): a pod just created is not created
again, a pod just deleted is not counted, a status just patched is the one the next reconcile
starts from.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Awaitable, Mapping, Optional, cast

import kopf

from dtrain_operator.api import (
    DistributedTraining,
    DistributedTrainingStatus,
    contract,
)
from dtrain_operator.controller import refusals, trusted
from dtrain_operator.controller.expectations import EXPECTATION_TTL_SECONDS, Expectations
from dtrain_operator.controller.kube import (
    ApiError,
    KubeClient,
    RateLimiter,
    connection_info,
    load_configuration,
)
from dtrain_operator.controller.leader import LeaderElectionConfig, LeaderElector
from dtrain_operator.controller.metrics import OperatorMetrics
from dtrain_operator.controller.status.compute import compute_status, invalid_status, succeeded_ranks, unreadable_status
from dtrain_operator.controller.status.events import JobEvent, only_counts_changed, status_events, status_patch
from dtrain_operator.controller.status.observe import controller_uid, observe_engine_job, observe_pod
from dtrain_operator.controller.workqueue import WorkQueue
from dtrain_operator.core import progress_deadline, render
from dtrain_operator.core.accepted import ParsedJob, accepted_job, parse_job
from dtrain_operator.core.gang import current_gang
from dtrain_operator.core.host_access import host_access_fields, host_access_refusals
from dtrain_operator.core.observation import EngineJobObservation, Limits, Observed, PodObservation
from dtrain_operator.core.plan import Plan, plan_children

logger = logging.getLogger(__name__)

JobKey = tuple[str, str]

POD_INDEX = "dtrain_pods"
ENGINE_JOB_INDEX = "dtrain_engine_jobs"
COUNTS_BATCH_SECONDS = 1.0
EVENT_SERIES_SECONDS = 600.0
"""A Warning that repeats within this long (Kubernetes' event aggregation window) counts up one Event."""
"""A status change of node counts alone waits this long, so that pods starting together share one patch."""


class ChildConflict(Exception):
    """A child's name is taken by an object this job does not own."""


def _newer(candidate: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether `candidate` is a later version of the object than `current`.

    Kubernetes resource versions compare as integers (they are etcd revisions, comparable
    since Kubernetes 1.35); when either does not parse, the later arrival wins.
    """
    try:
        return int(candidate["metadata"]["resourceVersion"]) >= int(current["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return True


def _key(body: Mapping[str, Any]) -> JobKey:
    meta = body.get("metadata") or {}
    return meta.get("namespace") or "default", meta.get("name", "")


class Controller:
    """Caches, expectations and the reconcile loop; kopf's handlers (handlers.py) feed it."""

    def __init__(
        self,
        metrics: OperatorMetrics,
        qps: float,
        burst: int,
        network_policy: bool = False,
        refuse_host_access: bool = False,
        limits: Limits = Limits(),
        election: Optional[LeaderElectionConfig] = None,
    ) -> None:
        self._network_policy = network_policy  # a NetworkPolicy per job: ingress only from its own pods
        self._refuse_host_access = refuse_host_access  # hostNetwork/hostPath only in opted-in namespaces
        self._limits = limits
        self._election = election
        self._elector: Optional[LeaderElector] = None
        self._keeping: Optional[asyncio.Task[None]] = None
        self._lease_client: Optional[KubeClient] = None
        self._pod_index: Optional[kopf.Index[JobKey, PodObservation]] = None
        self._engine_job_index: Optional[kopf.Index[JobKey, EngineJobObservation]] = None
        self._metrics = metrics
        self._limiter = RateLimiter(qps, burst)
        self._client: Optional[KubeClient] = None
        self._jobs: dict[JobKey, Mapping[str, Any]] = {}
        self._expectations: dict[JobKey, Expectations] = {}
        self._queue: WorkQueue[JobKey] = WorkQueue(self._reconcile_key, self._reconcile_failed)
        self._event_tasks: dict[JobKey, asyncio.Task[None]] = {}
        # Event series: (job, uid, reason) -> (Event name, count, last seen, monotonic).
        self._series: dict[tuple[JobKey, str, str], tuple[str, int, float]] = {}
        self._instance = os.environ.get("POD_ID") or socket.gethostname()

    # --- kopf's side ---------------------------------------------------------------------------

    async def login(self) -> kopf.ConnectionInfo:
        """Credentials for kopf's watches and the operator's own requests (again after a 401)."""
        configuration = await load_configuration()
        if self._client is None:
            self._client = KubeClient(configuration, self._limiter, self._metrics)
        else:
            self._client.use_configuration(configuration)
        return await connection_info(configuration)

    def start(self) -> None:
        if self._election is not None:
            self._keeping = asyncio.create_task(self._keep_lease(self._election), name="leader-election")
        self._queue.start()

    async def _keep_lease(self, election: LeaderElectionConfig) -> None:
        """The Lease was acquired before kopf started; it is renewed here, in kopf's loop, with a
        client of its own (its requests do not wait behind the reconciles' rate limit)."""
        self._lease_client = KubeClient(await load_configuration(), RateLimiter(5.0, 5), self._metrics)
        self._elector = LeaderElector(election, self._lease_client)
        self._elector.leading = True
        await self._elector.keep(self._lost_lease)

    @staticmethod
    def _lost_lease(why: str) -> None:
        # As kube-controller-manager: stop at once, before anything else is written; the Deployment
        # starts the container again, as a standby.
        logger.error("leader election: lost the lease (%s); exiting", why)
        logging.shutdown()
        os._exit(1)

    async def stop(self) -> None:
        await self._queue.stop()
        if self._keeping is not None:
            self._keeping.cancel()
            await asyncio.gather(self._keeping, return_exceptions=True)
        if self._lease_client is not None:
            await self._lease_client.close()
        # main.py releases the Lease once kopf has stopped.
        for task in list(self._event_tasks.values()):
            task.cancel()
        if self._client is not None:
            await self._client.close()

    def queue_length(self) -> int:
        return len(self._queue)

    def use_indexes(
        self, pods: kopf.Index[JobKey, PodObservation], engine_jobs: kopf.Index[JobKey, EngineJobObservation]
    ) -> None:
        """kopf's indexes of the jobs' pods and engine Jobs (handed over by every handler call)."""
        self._pod_index, self._engine_job_index = pods, engine_jobs

    def job_changed(self, event_type: Optional[str], body: Mapping[str, Any]) -> None:
        """A DistributedTraining event from the watch."""
        key = _key(body)
        if event_type == "DELETED":
            self._forget(key)
            return
        self._remember(key, body)
        self._queue.add(key)

    def child_changed(self, namespace: str, job_name: str, uid: str, event_type: Optional[str]) -> None:
        """A pod or engine Job event from the watch (the index already holds it)."""
        key = (namespace, job_name)
        expectations = self._expectations.get(key)
        if expectations is not None:
            expectations.created_pods.pop(uid, None)
            if event_type == "DELETED":
                expectations.deleted_pods.pop(uid, None)
            if expectations.engine_job is not None and expectations.engine_job[1].uid == uid:
                expectations.engine_job = None
        if key in self._jobs:
            self._queue.add(key)

    def _remember(self, key: JobKey, body: Mapping[str, Any]) -> None:
        current = self._jobs.get(key)
        uid = (body.get("metadata") or {}).get("uid", "")
        if current is not None and (current.get("metadata") or {}).get("uid") != uid:
            self._expectations.pop(key, None)
        elif current is not None and not _newer(body, current):
            return
        self._jobs[key] = body
        self._metrics.job_status(key, body.get("status") or {})

    def _forget(self, key: JobKey) -> None:
        for series_key in [k for k in self._series if k[0] == key]:
            del self._series[series_key]
        self._jobs.pop(key, None)
        self._expectations.pop(key, None)
        self._queue.forget(key)
        self._metrics.job_status(key, None)

    # --- Observation -------------------------------------------------------------------------------

    def _expect(self, key: JobKey, uid: str) -> Expectations:
        expectations = self._expectations.get(key)
        if expectations is None or expectations.uid != uid:
            expectations = self._expectations[key] = Expectations(uid=uid)
        return expectations

    def _observe(self, key: JobKey, expectations: Expectations) -> tuple[Observed, frozenset[str]]:
        """The job's children as the indexes show them, corrected by writes the watch has not shown yet.

        Returns the observation and the names of worker pods the job does not own (they block creation).
        """
        now = time.monotonic()
        pods: list[PodObservation] = list(self._pod_index.get(key, ())) if self._pod_index is not None else []
        engine_jobs: list[EngineJobObservation] = (
            list(self._engine_job_index.get(key, ())) if self._engine_job_index is not None else []
        )
        seen = {p.uid for p in pods}
        for uid, (since, _) in list(expectations.created_pods.items()):
            if uid in seen or now - since > EXPECTATION_TTL_SECONDS:
                del expectations.created_pods[uid]
        for uid, (since, _) in list(expectations.deleted_pods.items()):
            if uid not in seen and now - since > EXPECTATION_TTL_SECONDS:
                del expectations.deleted_pods[uid]

        owned: list[PodObservation] = []
        blocked: set[str] = set()
        for pod in pods:
            deleted = expectations.deleted_pods.get(pod.uid)
            if deleted is not None and deleted[1]:
                continue
            if deleted is not None and not pod.deleting:
                pod = replace(pod, deleting=True)
            if pod.role == contract.ROLE_WORKER and pod.owner_uid != expectations.uid:
                blocked.add(pod.name)
                continue
            owned.append(pod)
        owned.extend(p for _, p in expectations.created_pods.values() if p.uid not in seen)

        engine_job = next((j for j in engine_jobs if j.owner_uid == expectations.uid), None)
        if expectations.engine_job is not None:
            since, created = expectations.engine_job
            if engine_job is not None or now - since > EXPECTATION_TTL_SECONDS:
                expectations.engine_job = None
            else:
                engine_job = created
        workers = tuple(p for p in owned if p.role == contract.ROLE_WORKER)
        engine_pods = tuple(
            p for p in owned if p.role == contract.ROLE_ENGINE and engine_job is not None and p.owner_uid == engine_job.uid
        )
        return Observed(workers=workers, engine_pods=engine_pods, engine_job=engine_job), frozenset(blocked)

    # --- Reconcile ---------------------------------------------------------------------------------

    def _reconcile_failed(self, key: JobKey, exc: Exception) -> None:
        self._metrics.reconcile_errors.inc()
        namespace, name = key
        if isinstance(exc, (ApiError, ChildConflict)):
            logger.warning("%s/%s: %s; retrying", namespace, name, exc)
        else:
            logger.error("%s/%s: reconcile failed; retrying", namespace, name, exc_info=exc)

    async def _reconcile_key(self, key: JobKey) -> Optional[float]:
        started = time.monotonic()
        try:
            return await self.reconcile(key)
        finally:
            self._metrics.reconcile_seconds.observe(time.monotonic() - started)

    async def reconcile(self, key: JobKey) -> Optional[float]:
        """Bring one job's status and children in line with what is observed. Returns a requeue delay."""
        body = self._jobs.get(key)
        if body is None or self._client is None:
            return None
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return None  # the garbage collector removes the children through their owner references
        expectations = self._expect(key, meta.get("uid", ""))
        now = datetime.now(timezone.utc)
        read = trusted.read_status(body)
        problems = list(read.problems)
        try:
            state = trusted.read_state(body)
        except trusted.UntrustedState as exc:
            state = None
            problems.append(str(exc))
        written = read.status if body.get("status") else None
        if problems:
            # Nothing is decided from a status or a record the operator cannot read: the pods stay.
            logger.warning("%s/%s: cannot read %s; leaving the pods alone", *key, "; ".join(problems))
            return await self._write_status(key, body, written, unreadable_status(read.status, problems, now), expectations)
        observed, blocked = self._observe(key, expectations)
        previous = trusted.trusted_previous(
            read.status, state, [p.generation for p in observed.workers if p.generation is not None]
        )
        parsed = parse_job(body, previous)
        if parsed.job is not None and previous.accepted_spec is None and self._refuse_host_access:
            refused = await self._host_access_refusals(parsed.job)
            if refused:
                parsed = ParsedJob(None, tuple(refused))

        if parsed.job is None:
            new = invalid_status(previous, parsed.errors, meta.get("generation"), now)
            running: Optional[DistributedTraining] = None
        else:
            finished = state.succeeded_ranks if state is not None else ()
            watch = expectations.progress_watch = progress_deadline.observe(
                expectations.progress_watch,
                previous.restarts,
                _all_running(previous, observed, parsed.job.spec.nodes),
                previous.progress,
                now,
            )
            new = compute_status(parsed.job, observed, previous, now, parsed.errors, finished, self._limits, watch)
            running = accepted_job(parsed.job.model_copy(update={"status": new}))

        requeue = await self._write_status(key, body, written, new, expectations, decided_from=previous)
        await self._write_state(key, state, new, observed)
        if running is None:
            return requeue
        plan = plan_children(running, new, observed, now, self._limits)
        try:
            await self._carry_out(key, body, running, new.restarts, plan, blocked, expectations)
        except ChildConflict as exc:
            await self._report_conflict(key, body, str(exc), expectations)
            raise
        except refusals.CreateRefused as exc:
            return await self._report_refusal(key, body, new, exc.refusal, expectations, state, observed)
        expectations.conflict_reported = ""
        if refusals.is_refused(new):
            expectations.refusal_reported = ""
            await self._write_status(key, body, new, refusals.cleared_status(new, now), expectations)
        hang_check = progress_deadline.wake_after(running.spec.run_policy, expectations.progress_watch, now)
        delays = [d for d in (requeue, plan.requeue_after, hang_check) if d is not None]
        return min(delays) if delays else None

    async def _host_access_refusals(self, job: DistributedTraining) -> list[str]:
        """Why the job may not reach the node (host_access.py decides); checked once, before it is accepted."""
        assert self._client is not None
        if not host_access_fields(job.spec):
            return []
        try:
            labels = await self._client.namespace_labels(job.namespace)
        except ApiError as exc:  # fail closed: without the namespace's word, no host access
            return [f"spec: host access needs the namespace's {contract.LABEL_ALLOW_HOST_ACCESS} label, which the "
                    f"operator cannot read ({exc.status} {exc.reason}); grant it get on namespaces"]
        return host_access_refusals(job.spec, job.namespace, labels)

    async def _write_status(
        self,
        key: JobKey,
        body: Mapping[str, Any],
        previous: Optional[DistributedTrainingStatus],
        new: DistributedTrainingStatus,
        expectations: Expectations,
        decided_from: Optional[DistributedTrainingStatus] = None,
    ) -> Optional[float]:
        """Patch the status when it changed (node counts alone: batched), then post the Events.

        `previous` is the status as written (what the patch must change); `decided_from` what
        the new status was decided from (the operator's own record: phase changes and restarts).
        """
        assert self._client is not None
        patch = status_patch(previous, new)
        if decided_from is not None:
            previous = decided_from
        if patch is None:
            expectations.counts_pending_since = None
            return None
        if only_counts_changed(patch):
            now = time.monotonic()
            if expectations.counts_pending_since is None:
                expectations.counts_pending_since = now
            waited = now - expectations.counts_pending_since
            if waited < COUNTS_BATCH_SECONDS:
                return COUNTS_BATCH_SECONDS - waited
        expectations.counts_pending_since = None
        namespace, name = key
        updated = await self._client.patch_status(namespace, name, patch)
        if updated:
            self._remember(key, updated)
        restarts = new.restarts - (previous.restarts if previous else 0)
        if restarts > 0:
            restarting = next((c for c in new.conditions if c.type == "Restarting"), None)
            self._metrics.gang_restart(restarts, restarting.reason if restarting else "")
        if "phase" in patch:
            logger.info("%s/%s: %s -> %s", namespace, name, previous.phase if previous else None, new.phase)
        events = status_events(previous, new)
        if events:
            self._post_events(key, body, events)
        return None

    async def _write_state(
        self, key: JobKey, state: Optional[trusted.TrustedState], new: DistributedTrainingStatus, observed: Observed
    ) -> None:
        """Record what was decided in the operator's own annotation, before anything is carried out."""
        assert self._client is not None
        earlier = (state.succeeded_ranks, state.restarts) if state is not None else ((), None)
        recorded = trusted.state_of(new, succeeded_ranks(new, observed, *earlier))
        if recorded is None or recorded == state:
            return
        namespace, name = key
        updated = await self._client.patch(
            contract.API_VERSION, contract.KIND, namespace, name, trusted.state_patch(recorded)
        )
        if updated:
            self._remember(key, updated)

    def _post_events(self, key: JobKey, body: Mapping[str, Any], events: list[JobEvent]) -> None:
        """Post Events in the background (children are not kept waiting), in order for each job."""
        earlier = self._event_tasks.get(key)
        task = asyncio.create_task(self._post_in_order(key, body, events, earlier))
        self._event_tasks[key] = task
        task.add_done_callback(lambda done: self._event_tasks.pop(key) if self._event_tasks.get(key) is done else None)

    async def _post_in_order(
        self, key: JobKey, body: Mapping[str, Any], events: list[JobEvent], earlier: Optional[asyncio.Task[None]]
    ) -> None:
        if earlier is not None:
            await asyncio.wait([earlier])
        assert self._client is not None
        uid = (body.get("metadata") or {}).get("uid", "")
        for event in events:
            try:
                await self._post_event(key, uid, body, event)
            except ApiError as exc:
                logger.warning("%s/%s: could not post the %s event: %s", *key, event.reason, exc)

    async def _post_event(self, key: JobKey, uid: str, body: Mapping[str, Any], event: JobEvent) -> None:
        """Post an Event; a repeat of a series within EVENT_SERIES_SECONDS counts up the Event posted first."""
        assert self._client is not None
        now = time.monotonic()
        series_key = (key, uid, event.reason)
        earlier = self._series.get(series_key) if event.series else None
        if earlier is not None and now - earlier[2] <= EVENT_SERIES_SECONDS:
            name, count, _ = earlier
            try:
                await self._client.repeat_event(key[0], name, count + 1, event.message)
                self._series[series_key] = (name, count + 1, now)
                return
            except ApiError as exc:
                if not exc.not_found:
                    raise
        created = await self._client.post_event(body, event.type, event.reason, event.message, self._instance)
        if event.series:
            self._series[series_key] = (str((created.get("metadata") or {}).get("name", "")), 1, now)

    async def _report_conflict(
        self, key: JobKey, body: Mapping[str, Any], message: str, expectations: Expectations
    ) -> None:
        """A Warning Event, once per distinct conflict, so that `kubectl describe` says why nothing starts."""
        if expectations.conflict_reported == message or self._client is None:
            return
        expectations.conflict_reported = message
        try:
            await self._client.post_event(body, "Warning", "ChildConflict", message, self._instance)
        except ApiError as exc:
            logger.warning("%s/%s: could not post the ChildConflict event: %s", *key, exc)

    async def _report_refusal(
        self,
        key: JobKey,
        body: Mapping[str, Any],
        status: DistributedTrainingStatus,
        refusal: refusals.Refusal,
        expectations: Expectations,
        state: Optional[trusted.TrustedState],
        observed: Observed,
    ) -> Optional[float]:
        """A refused create (refusals.py decides): the condition, a Warning Event with the API server's
        message (once per distinct message), and the retry, or the failed job."""
        assert self._client is not None
        now = datetime.now(timezone.utc)
        refused = refusals.refused_status(status, refusal, now)
        await self._write_status(key, body, status, refused, expectations)
        # A refusal that fails the job is a decision: the operator's own record must say so too.
        await self._write_state(key, state, refused, observed)
        if expectations.refusal_reported != refusal.message:
            expectations.refusal_reported = refusal.message
            logger.warning("%s/%s: %s", *key, refusal.message)
            try:
                await self._client.post_event(body, "Warning", refusal.reason, refusal.message, self._instance)
            except ApiError as exc:
                logger.warning("%s/%s: could not post the %s event: %s", *key, refusal.reason, exc)
        return None if refusal.fails_job else refusals.retry_after(refused, now)

    async def _carry_out(
        self,
        key: JobKey,
        body: Mapping[str, Any],
        job: DistributedTraining,
        generation: int,
        plan: Plan,
        blocked: frozenset[str],
        expectations: Expectations,
    ) -> None:
        """Deletions first, then creations; every call is safe to repeat."""
        assert self._client is not None
        namespace, name = key
        await _gather(
            *(self._delete_pod(namespace, pod, expectations, plan.delete_grace_seconds) for pod in plan.delete_pods)
        )
        now = time.monotonic()
        # Each stuck pod is force-deleted once per expectation TTL, not at every reconcile.
        forced = [
            p for p in plan.force_delete_pods if now - expectations.forced_pods.get(p.uid, -EXPECTATION_TTL_SECONDS) >= EXPECTATION_TTL_SECONDS
        ]
        for pod in forced:
            logger.warning("%s/%s: %s is stuck terminating and its node stopped reporting; force-deleting it",
                           namespace, name, pod.name)
            expectations.forced_pods[pod.uid] = now
        await _gather(*(self._delete_pod(namespace, pod, expectations, grace_seconds=0) for pod in forced))
        if plan.delete_engine_job is not None:
            await self._delete(
                "batch/v1", "Job", namespace, plan.delete_engine_job.name, plan.delete_engine_job.uid, "Background"
            )
        ranks = [rank for rank in plan.create_ranks if render.worker_pod_name(job, rank) not in blocked]
        if ranks:
            pods = [render.render_worker_pod(job, rank, generation) for rank in ranks]
            _adopt(pods, body)
            await self._ensure_shared_children(body, job, generation, expectations)
            await _gather(*(self._create_pod(pod, expectations) for pod in pods))
            logger.info("%s/%s: created %d worker pod(s) of gang generation %d", namespace, name, len(pods), generation)
        if len(ranks) < len(plan.create_ranks):
            raise ChildConflict(
                "worker pod names are taken by pods this job does not own (left by an earlier job of the same "
                "name?); waiting for them to go"
            )
        if plan.create_engine_job:
            engine_job = render.render_engine_job(job)
            _adopt([engine_job], body)
            created, _ = await self._create_owned(engine_job, expectations.uid)
            expectations.engine_job = (time.monotonic(), observe_engine_job(created))
            logger.info("%s/%s: created the engine Job %s", namespace, name, engine_job["metadata"]["name"])
        if plan.delete_job:
            logger.info("%s/%s: ttlSecondsAfterFinished has passed; deleting the job", namespace, name)
            await self._delete(contract.API_VERSION, contract.KIND, namespace, name, expectations.uid, "Background")

    async def _ensure_shared_children(
        self, body: Mapping[str, Any], job: DistributedTraining, generation: int, expectations: Expectations
    ) -> None:
        """The Service, ConfigMap (and PodGroup) the pods need, known to be this job's before any pod
        is created: a ConfigMap of the same name left by someone else must never configure its trainers.
        Once per gang generation, so that one deleted by hand is back for the next gang."""
        if expectations.shared_children_for == generation:
            return
        children = [render.render_service(job), render.render_config_map(job)]
        pod_group = render.render_pod_group(job)
        if pod_group is not None:
            children.append(pod_group)
        if self._network_policy:
            children.append(render.render_network_policy(job))
        _adopt(children, body)
        await _gather(*(self._create_owned(child, expectations.uid) for child in children))
        expectations.shared_children_for = generation

    async def _create_owned(self, obj: dict[str, Any], owner_uid: str) -> tuple[dict[str, Any], bool]:
        """Create a child; if it exists already it must be this job's (then it is adopted as is)."""
        assert self._client is not None
        try:
            existing, created = await self._client.create_or_read(obj)
        except ApiError as exc:
            meta = obj["metadata"]
            refusal = refusals.classify(obj["kind"], f"{meta['namespace']}/{meta['name']}", exc.status, exc.message)
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

    async def _create_pod(self, pod: dict[str, Any], expectations: Expectations) -> None:
        # A 409 then a 404 (the pod went between the two) fails this reconcile: it is retried.
        existing, _ = await self._create_owned(pod, expectations.uid)
        observation = observe_pod(existing)
        expectations.created_pods[observation.uid] = (time.monotonic(), observation)

    async def _delete_pod(
        self, namespace: str, pod: PodObservation, expectations: Expectations, grace_seconds: Optional[int] = None
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
        propagation: Optional[str] = None,
        grace_seconds: Optional[int] = None,
    ) -> bool:
        """Delete one incarnation of an object. Returns True when it is known to be gone already."""
        assert self._client is not None
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


def _all_running(status: DistributedTrainingStatus, observed: Observed, nodes: int) -> bool:
    """Every worker of the current gang generation is Running (the progress deadline's clock runs)."""
    gang = current_gang(status, observed.workers)
    return len(gang) == nodes and all(p.phase == "Running" and not p.deleting for p in gang.values())


def _adopt(children: list[dict[str, Any]], body: Mapping[str, Any]) -> None:
    """The one place where children get their owner reference to the DistributedTraining
    (controller, blockOwnerDeletion): the garbage collector deletes them with it."""
    kopf.append_owner_reference(children, owner=kopf.Body(cast(kopf.RawBody, body)))


async def _gather(*calls: Awaitable[Any]) -> None:
    """Run calls at once; when some fail, raise the first failure after all have finished."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
