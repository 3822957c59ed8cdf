"""The reconciler: one DistributedTraining at a time, level-triggered, from cached observations.

kopf watches DistributedTrainings, worker/engine pods, engine Jobs and the jobs' Services (server-side label
selectors) and keeps the latter three in its indexes; every job, pod or Job event queues the owning job here.
A queued job is reconciled by one worker at a time: its status is computed (core/status/compute.py) from the
status the operator wrote last (its record of the job: core/status/read.py) and patched, at most once, when it
differs; Events are posted, then the plan (core/child_plan.py) is carried out (children.py): deletions, then
creations. What the carry-out met (a create refused, or every create through after a refusal) goes into the
next reconcile's status, which follows at once. A status that cannot be read is reported and nothing is
carried out. No list call is made per reconcile; only the Lease holder reconciles (leader.py).

The watch lags behind the operator's own writes, so the writes are remembered until the watch
shows them (as Kubernetes controllers' "expectations"): a pod just created is not created
again, a pod just deleted is not counted, a status just patched is the one the next reconcile
starts from.
"""

# layout: the Controller's caches, its reconcile and the status writes share one job's state, so they
# stay together (a little over 400 lines); children, Events, expectations and the work queue are modules of their own.

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import kopf

from dtrain_operator.api import (
    DistributedTraining,
    DistributedTrainingStatus,
    contract,
)
from dtrain_operator.api.job_defaults import JobDefaults
from dtrain_operator.api.launches import LaunchOrder, LaunchReport
from dtrain_operator.api.record_patches import replacing_maps, with_records
from dtrain_operator.controller import refusals
from dtrain_operator.controller.children import EVENT_CHILD_CONFLICT, ChildConflict, ChildWriter
from dtrain_operator.controller.event_recorder import EventRecorder
from dtrain_operator.controller.expectations import Expectations, observe_with_expectations
from dtrain_operator.controller.job_memory import CREATED, JobMemory
from dtrain_operator.controller.kube import (
    ApiError,
    KubeClient,
    RateLimiter,
    connection_info,
    load_configuration,
)
from dtrain_operator.controller.leader import LeaderElectionConfig, LeaderElector
from dtrain_operator.controller.metrics import OperatorMetrics
from dtrain_operator.controller.report_server import ReportServer, TokenReviewer
from dtrain_operator.controller.report_tls import ReportTLS
from dtrain_operator.controller.report_writes import CoalescedWrites
from dtrain_operator.controller.supervisors import Supervisors
from dtrain_operator.controller.workqueue import WorkQueue
from dtrain_operator.core import goodput, progress_deadline, queueing
from dtrain_operator.core.accepted import ParsedJob, accepted_job, parse_job
from dtrain_operator.core.child_plan import plan_children
from dtrain_operator.core.gang_state import current_gang
from dtrain_operator.core.host_access import host_access_fields, host_access_refusals
from dtrain_operator.core.launch_env import ReportEndpoint
from dtrain_operator.core.observation import EngineJobObservation, JobKey, Limits, Observed, PodObservation
from dtrain_operator.core.status.compute import compute_status
from dtrain_operator.core.status.events import status_events, status_patch, worth_batching
from dtrain_operator.core.status.invalid import invalid_status, unreadable_status
from dtrain_operator.core.status.observe import observe_queue
from dtrain_operator.core.status.read import read_status, starting_status
from dtrain_operator.core.tenancy import Tenancy, tenancy_refusals

logger = logging.getLogger(__name__)


POD_INDEX = "dtrain_pods"
ENGINE_JOB_INDEX = "dtrain_engine_jobs"
SERVICE_INDEX = "dtrain_services"
COUNTS_BATCH_SECONDS = 1.0
"""A status change of node counts alone (core.status.events.worth_batching) waits this long, so that pods scheduled
and started together share one patch."""


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
        tenancy: Tenancy,
        job_defaults: JobDefaults,
        network_policy: bool = False,
        refuse_host_access: bool = False,
        limits: Limits = Limits(),
        election: LeaderElectionConfig | None = None,
        report: ReportEndpoint | None = None,
        report_tls: ReportTLS | None = None,
        report_port: int = contract.DEFAULT_REPORT_PORT,
    ) -> None:
        self._network_policy = network_policy  # a NetworkPolicy per job: ingress only from its own pods
        self._refuse_host_access = refuse_host_access  # hostNetwork/hostPath only in opted-in namespaces
        self._tenancy = tenancy  # who a job's pods may be (tenancy.py)
        self._job_defaults = job_defaults  # what every job leaves unset (api/job_defaults.py)
        self._limits = limits
        self._election = election
        self._report = report  # rank 0's records come to report_server.py, which writes them through write_reports
        self._report_tls = report_tls
        self._report_port = report_port
        self._reports: ReportServer | None = None
        self._report_client: KubeClient | None = None
        self._report_writes: CoalescedWrites | None = None
        self._elector: LeaderElector | None = None
        self._keeping: asyncio.Task[None] | None = None
        self._lease_client: KubeClient | None = None
        self._pod_index: kopf.Index[JobKey, PodObservation] | None = None
        self._engine_job_index: kopf.Index[JobKey, EngineJobObservation] | None = None
        self._service_index: kopf.Index[JobKey, str | None] | None = None  # each job's Service: its owner's uid
        self._metrics = metrics
        self._limiter = RateLimiter(qps, burst)
        self._client: KubeClient | None = None
        self._jobs: dict[JobKey, Mapping[str, Any]] = {}
        self._memories: dict[JobKey, JobMemory] = {}
        self._supervisors = Supervisors()
        self._queue: WorkQueue[JobKey] = WorkQueue(self._reconcile_key, self._reconcile_failed)
        self._instance = os.environ.get("POD_ID") or socket.gethostname()
        # With the client, at the first login:
        self._events: EventRecorder | None = None
        self._children: ChildWriter | None = None

    # --- kopf's side ---------------------------------------------------------------------------

    async def login(self) -> kopf.ConnectionInfo:
        """Credentials for kopf's watches and the operator's own requests (again after a 401)."""
        configuration = await load_configuration()
        if self._client is None:
            self._client = KubeClient(configuration, self._limiter, self._metrics)
            self._events = EventRecorder(self._client, self._instance)
            self._children = ChildWriter(self._client, self._network_policy, self._report)
        else:
            self._client.use_configuration(configuration)
        return await connection_info(configuration)

    async def start(self) -> None:
        if self._election is not None:
            self._keeping = asyncio.create_task(self._keep_lease(self._election), name="leader-election")
        self._queue.start()
        if self._report_tls is not None:
            # TokenReviews on a client of their own: a report never waits behind the reconciles' rate limit.
            self._report_client = KubeClient(await load_configuration(), RateLimiter(20.0, 20), self._metrics)
            self._report_writes = CoalescedWrites(self._write_records)
            self._reports = ReportServer(self._report_tls, self._report_port, self, TokenReviewer(self._report_client))
            await self._reports.start()

    async def _keep_lease(self, election: LeaderElectionConfig) -> None:
        """The Lease was acquired before kopf started; it is renewed here, in kopf's loop, with a
        client of its own (its requests do not wait behind the reconciles' rate limit)."""
        self._lease_client = KubeClient(await load_configuration(), RateLimiter(5.0, 5), self._metrics)
        self._elector = LeaderElector(election, self._lease_client)
        self._elector.leading = True
        await self._elector.keep(self._lost_lease, self._stand_down, self._lead_again)

    @staticmethod
    def _stand_down(why: str) -> None:
        logger.error("leader election: %s; acting no more until it is renewed", why)

    def _lead_again(self) -> None:
        """The Lease renewed after an outage: every job is looked at again (events missed meanwhile included)."""
        logger.warning("leader election: the lease is renewed; leading again")
        for key in list(self._jobs):
            self._queue.add(key)

    @staticmethod
    def _lost_lease(why: str) -> None:
        # As kube-controller-manager: stop at once, before anything else is written; the Deployment
        # starts the container again, as a standby.
        logger.error("leader election: lost the lease (%s); exiting", why)
        logging.shutdown()
        os._exit(1)

    async def stop(self) -> None:
        if self._reports is not None:
            await self._reports.stop()
        if self._report_writes is not None:
            await self._report_writes.stop()
        if self._report_client is not None:
            await self._report_client.close()
        await self._queue.stop()
        if self._keeping is not None:
            self._keeping.cancel()
            await asyncio.gather(self._keeping, return_exceptions=True)
        if self._lease_client is not None:
            await self._lease_client.close()
        # main.py releases the Lease once kopf has stopped.
        if self._events is not None:
            self._events.stop()
        if self._client is not None:
            await self._client.close()

    # --- The report endpoint's side (report_server.Jobs) -----------------------------------------

    def job_uid(self, namespace: str, name: str) -> str | None:
        body = self._jobs.get((namespace, name))
        return str((body.get("metadata") or {}).get("uid") or "") or None if body is not None else None

    def pod_of(self, namespace: str, name: str, pod_uid: str) -> PodObservation | None:
        pods = self._pod_index.get((namespace, name), ()) if self._pod_index is not None else ()
        return next((pod for pod in pods if pod.uid == pod_uid), None)

    async def write_reports(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Rank 0's records into the status, coalesced per job (report_writes.py); the job is reconciled at once,
        from its status with the records not written yet on it."""
        assert self._report_writes is not None
        self._report_writes.add((namespace, name), patch)
        self._queue.add((namespace, name))

    def _records_pending(self, key: JobKey) -> dict[str, Any]:
        return self._report_writes.pending(key) if self._report_writes is not None else {}

    async def _write_records(self, key: JobKey, patch: Mapping[str, Any]) -> None:
        """One coalesced write of a job's records, on the report endpoint's client: the maps a record replaces lose
        the keys it no longer sends (api.records.replacing_maps)."""
        assert self._report_client is not None
        status = (self._jobs.get(key) or {}).get("status") or {}
        await self._report_client.patch_status(*key, replacing_maps(patch, status))

    def launch_reported(self, namespace: str, name: str, pod: PodObservation, report: LaunchReport) -> None:
        """A supervisor's report (supervisors.py); one that says something new reconciles the job."""
        if self._supervisors.report((namespace, name), pod.uid, report, datetime.now(timezone.utc)):
            self._queue.add((namespace, name))

    def launch_order(self, namespace: str, name: str, pod: PodObservation) -> LaunchOrder | None:
        return self._supervisors.order((namespace, name), pod)

    async def launch_decided(self, namespace: str, name: str, timeout: float) -> None:
        await self._supervisors.changed((namespace, name), timeout)

    def queue_length(self) -> int:
        return len(self._queue)

    def use_indexes(self, indexes: Mapping[str, Any]) -> None:
        """kopf's indexes of the jobs' pods, engine Jobs and Services (handed over by every handler call)."""
        self._pod_index, self._engine_job_index = indexes[POD_INDEX], indexes[ENGINE_JOB_INDEX]
        self._service_index = indexes[SERVICE_INDEX]

    def job_changed(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A DistributedTraining event from the watch."""
        key = _key(body)
        if event_type == "DELETED":
            self._forget(key)
            return
        self._remember(key, body)
        self._queue.add(key)

    def child_changed(self, namespace: str, job_name: str, uid: str, event_type: str | None) -> None:
        """A pod or engine Job event from the watch (the index already holds it)."""
        key = (namespace, job_name)
        memory = self._memories.get(key)
        if memory is not None:
            expectations = memory.expectations
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
            self._memories.pop(key, None)
        elif current is not None and not _newer(body, current):
            return
        self._jobs[key] = body
        self._metrics.job_status(key, body.get("status") or {})

    def _forget(self, key: JobKey) -> None:
        if self._events is not None:
            self._events.forget(key)
        self._jobs.pop(key, None)
        self._memories.pop(key, None)
        self._supervisors.forget(key)
        self._queue.forget(key)
        if self._report_writes is not None:
            self._report_writes.forget(key)
        self._metrics.job_status(key, None)
        self._metrics.job_goodput(key, None)

    # --- Observation -------------------------------------------------------------------------------

    def _memory(self, key: JobKey, uid: str) -> JobMemory:
        memory = self._memories.get(key)
        if memory is None or memory.uid != uid:
            memory = self._memories[key] = JobMemory(Expectations(uid=uid))
        return memory

    def _owned_service(self, key: JobKey, meta: Mapping[str, Any]) -> bool:
        """The watch shows the job's Service, owned by this job."""
        owners = self._service_index.get(key, ()) if self._service_index is not None else ()
        return meta.get("uid") in owners

    def _observe(self, key: JobKey, expectations: Expectations) -> tuple[Observed, frozenset[str]]:
        pods = list(self._pod_index.get(key, ())) if self._pod_index is not None else []
        engine_jobs = list(self._engine_job_index.get(key, ())) if self._engine_job_index is not None else []
        observed, blocked = observe_with_expectations(pods, engine_jobs, expectations, time.monotonic())
        return dataclasses.replace(observed, workers=self._supervisors.attach(key, observed.workers)), blocked

    async def _observe_queue(self, key: JobKey, body: Mapping[str, Any], observed: Observed) -> Observed:
        """For a job whose workers Kueue holds, its Workload and LocalQueue (two GETs, only while queued: the
        ungating of the pods is what the operator waits for, and their watch brings it)."""
        local_queue = ((body.get("metadata") or {}).get("labels") or {}).get(queueing.QUEUE_LABEL)
        if not local_queue or not any(p.queued for p in observed.workers) or self._client is None:
            return observed
        namespace, name = key
        found: list[Mapping[str, Any]] = []
        for kind, object_name in (("Workload", name), ("LocalQueue", local_queue)):
            try:
                found.append(await self._client.get(queueing.WORKLOAD_API, kind, namespace, object_name))
            except ApiError as exc:
                logger.debug("%s/%s: no Kueue %s %s (%s)", namespace, name, kind, object_name, exc)
                found.append({})
        return dataclasses.replace(observed, queue=observe_queue(local_queue, *found))

    # --- Reconcile ---------------------------------------------------------------------------------

    def _reconcile_failed(self, key: JobKey, exc: Exception) -> None:
        self._metrics.reconcile_errors.inc()
        namespace, name = key
        if isinstance(exc, (ApiError, ChildConflict)):
            logger.warning("%s/%s: %s; retrying", namespace, name, exc)
        else:
            logger.error("%s/%s: reconcile failed; retrying", namespace, name, exc_info=exc)

    async def _reconcile_key(self, key: JobKey) -> float | None:
        started = time.monotonic()
        try:
            return await self.reconcile(key)
        finally:
            self._metrics.reconcile_seconds.observe(time.monotonic() - started)

    # layout: the reconcile reads top to bottom as the module docstring tells it (a little over 60 lines).
    async def reconcile(self, key: JobKey) -> float | None:
        """Bring one job's status and children in line with what is observed. Returns a requeue delay."""
        body = self._jobs.get(key)
        if body is None or self._client is None or (self._elector is not None and not self._elector.leading):
            return None  # a leader standing down acts on nothing (leader.py); it looks again once it leads
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return None  # the garbage collector removes the children through their owner references
        memory = self._memory(key, meta.get("uid", ""))
        expectations = memory.expectations
        now = datetime.now(timezone.utc)
        records = self._records_pending(key)
        read = read_status({**body, "status": with_records(body.get("status") or {}, records)} if records else body)
        written = read.status if body.get("status") else None
        if read.problems:
            # Nothing is decided from a status the operator cannot read: the pods stay.
            logger.warning("%s/%s: cannot read %s; leaving the pods alone", *key, "; ".join(read.problems))
            return await self._write_status(
                key, body, written, unreadable_status(read.status, list(read.problems), now), memory
            )
        observed, blocked = self._observe(key, expectations)
        observed = await self._observe_queue(key, body, observed)
        previous = starting_status(read.status, [p.generation for p in observed.workers if p.generation is not None])
        previous = previous.model_copy(update={"goodput": goodput.latest(previous.goodput, memory.goodput)})
        parsed = await self._parse(body, previous, memory)

        if parsed.job is None:
            new, refused = _with_create_outcome(
                memory, invalid_status(previous, parsed.errors, meta.get("generation"), now), now
            )
            running: DistributedTraining | None = None
        else:
            watch = memory.progress_watch = progress_deadline.observe(
                memory.progress_watch,
                previous.gang_generation,
                _all_running(previous, observed, parsed.job.spec.nodes),
                previous.progress,
                now,
            )
            new = compute_status(parsed.job, observed, previous, now, parsed.errors, self._limits, watch)
            memory.goodput = new.goodput
            self._metrics.job_goodput(key, new.goodput)
            new, refused = _with_create_outcome(memory, new, now)
            running = accepted_job(parsed.job.model_copy(update={"status": new}))

        requeue = await self._write_status(key, body, written, new, memory, decided_from=previous)
        self._supervisors.decided(key, running, new)
        if running is None:
            return requeue
        if refused is not None:  # this status records a refused create: the next try waits its backoff
            return None if refused.fails_job else refusals.retry_after(new, now)
        plan = plan_children(running, new, observed, now, self._limits)
        try:
            assert self._children is not None
            await self._children.carry_out(
                key, body, running, new.gang_generation, plan, blocked, expectations, self._owned_service(key, meta)
            )
        except ChildConflict as exc:
            await self._report_conflict(key, body, str(exc), memory)
            raise
        except refusals.CreateRefused as exc:
            return await self._report_refusal(key, body, exc.refusal, memory)
        memory.conflict_reported = ""
        if refusals.is_refused(new):
            memory.refusal_reported = ""
            memory.create_outcome = CREATED
            return 0.0  # the next status says every create went through
        hang_check = progress_deadline.wake_after(running.spec.run_policy, memory.progress_watch, now)
        delays = [d for d in (requeue, plan.requeue_after, hang_check) if d is not None]
        return min(delays) if delays else None

    async def _parse(
        self, body: Mapping[str, Any], previous: DistributedTrainingStatus, memory: JobMemory
    ) -> ParsedJob:
        """The job with the spec it runs (core.accepted); before it is accepted, refused when it would run as
        more than its namespace allows (tenancy.py), asks for host access its namespace does not allow, or
        the API server refuses a child it would get (a dry run: core.server_check)."""
        parsed = parse_job(body, previous, self._job_defaults.for_namespace(_key(body)[0]))
        if parsed.job is None or previous.accepted_spec is not None:
            return parsed
        refused = tenancy_refusals(parsed.job.spec, parsed.job.namespace, self._tenancy)
        if not refused and self._refuse_host_access:
            refused = await self._host_access_refusals(parsed.job)
        if not refused:
            refused = await self._server_refusals(body, parsed.job, memory)
        return ParsedJob(None, tuple(refused)) if refused else parsed

    async def _server_refusals(
        self, body: Mapping[str, Any], job: DistributedTraining, memory: JobMemory
    ) -> list[str]:
        """The API server's refusals of the job's children (ChildWriter.server_refusals), asked once per spec."""
        generation = (body.get("metadata") or {}).get("generation")
        if memory.server_verdict is None or memory.server_verdict[0] != generation:
            assert self._children is not None
            memory.server_verdict = (generation, tuple(await self._children.server_refusals(body, job)))
        return list(memory.server_verdict[1])

    async def _host_access_refusals(self, job: DistributedTraining) -> list[str]:
        """Why the job may not reach the node (host_access.py decides); checked once, before it is accepted."""
        assert self._client is not None
        if not host_access_fields(job.spec):
            return []
        try:
            labels = await self._client.namespace_labels(job.namespace)
        except ApiError as exc:  # fail closed: without the namespace's word, no host access
            return [
                (f"spec: host access needs the namespace's {contract.LABEL_ALLOW_HOST_ACCESS} label, which the "
                 f"operator cannot read ({exc.status} {exc.reason}); grant it get on namespaces")
            ]
        return host_access_refusals(job.spec, job.namespace, labels)

    async def _write_status(
        self,
        key: JobKey,
        body: Mapping[str, Any],
        previous: DistributedTrainingStatus | None,
        new: DistributedTrainingStatus,
        memory: JobMemory,
        decided_from: DistributedTrainingStatus | None = None,
    ) -> float | None:
        """Patch the status when it changed (node counts alone: batched) or rank 0's records hold news, then post the
        Events.

        `previous` is the status as written (what the patch must change); `decided_from` what
        the new status was decided from (phase changes and restarts).
        """
        assert self._client is not None
        patch = status_patch(previous, new)
        if patch is not None and set(patch) == {"goodput"}:
            patch = patch if goodput.worth_a_write(previous.goodput if previous else None, new.goodput) else None
        if decided_from is not None:
            previous = decided_from
        news = self._report_writes is not None and self._report_writes.news(key)
        if patch is None and not news:
            memory.counts_pending_since = None
            return None
        patch = patch or {}
        if worth_batching(patch) and not news:
            now = time.monotonic()
            if memory.counts_pending_since is None:
                memory.counts_pending_since = now
            waited = now - memory.counts_pending_since
            if waited < COUNTS_BATCH_SECONDS:
                return COUNTS_BATCH_SECONDS - waited
        memory.counts_pending_since = None
        namespace, name = key
        # Rank 0's records not written yet go with it: one write, and a status whose parts agree.
        records = self._records_pending(key)
        updated = await self._client.patch_status(
            namespace, name, {**replacing_maps(records, body.get("status") or {}), **patch}
        )
        if records and self._report_writes is not None:
            self._report_writes.written(key, records)
        if updated:
            self._remember(key, updated)
        # Restarts a RestartGangIgnoringBackoff rule decided are gang restarts too (Kueue's evictions are not).
        restarts = new.restarts + new.restarts_ignoring_backoff - (
            previous.restarts + previous.restarts_ignoring_backoff if previous else 0
        )
        if restarts > 0:
            restarting = next((c for c in new.conditions if c.type == "Restarting"), None)
            self._metrics.gang_restart(restarts, restarting.reason if restarting else "")
        if "phase" in patch:
            logger.info("%s/%s: %s -> %s", namespace, name, previous.phase if previous else None, new.phase)
        events = status_events(previous, new)
        if events:
            assert self._events is not None
            self._events.post(key, body, events)
        return None

    async def _report_conflict(
        self, key: JobKey, body: Mapping[str, Any], message: str, memory: JobMemory
    ) -> None:
        """A Warning Event, once per distinct conflict, so that `kubectl describe` says why nothing starts."""
        if memory.conflict_reported == message or self._events is None:
            return
        memory.conflict_reported = message
        await self._events.warn(key, body, EVENT_CHILD_CONFLICT, message)

    async def _report_refusal(
        self, key: JobKey, body: Mapping[str, Any], refusal: refusals.Refusal, memory: JobMemory
    ) -> float:
        """A refused create (refusals.py decides): a Warning Event with the API server's message (once per distinct
        message) now; the condition, and the retry or the failed job, with the next status, at once."""
        assert self._events is not None
        memory.create_outcome = refusal
        if memory.refusal_reported != refusal.message:
            memory.refusal_reported = refusal.message
            logger.warning("%s/%s: %s", *key, refusal.message)
            await self._events.warn(key, body, refusal.reason, refusal.message)
        return 0.0


def _with_create_outcome(
    memory: JobMemory, status: DistributedTrainingStatus, now: datetime
) -> tuple[DistributedTrainingStatus, refusals.Refusal | None]:
    """`status` with what the last carry-out met (a refused create, or every create through after one), and the
    refusal it now records, if any."""
    outcome, memory.create_outcome = memory.create_outcome, None
    if outcome is None:
        return status, None
    if outcome == CREATED:
        return (refusals.cleared_status(status, now) if refusals.is_refused(status) else status), None
    return refusals.refused_status(status, outcome, now), outcome


def _all_running(status: DistributedTrainingStatus, observed: Observed, nodes: int) -> bool:
    """Every worker of the current gang generation is Running (the progress deadline's clock runs)."""
    gang = current_gang(status, observed.workers)
    return len(gang) == nodes and all(p.phase == "Running" and not p.deleting for p in gang.values())


