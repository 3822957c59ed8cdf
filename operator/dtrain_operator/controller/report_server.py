"""The operator's report endpoint: rank 0's records reach the job's status through the operator alone, and
each worker pod's supervisor learns whether to run, stop or restart torchrun.

Rank 0 POSTs `{"records": [...]}` (the trainer's typed records, dtrain_operator.api.records) over
HTTPS to `/v1/namespaces/<ns>/distributedtrainings/<name>/records` on the report Service, with a
projected service-account token whose audience is the operator's (contract.OPERATOR_TOKEN_AUDIENCE).
A request is taken only when, in this order:

1. this replica leads (a standby answers 503, and the trainer tries the Service's next address);
2. the API server's TokenReview says the token is valid for that audience and bound to a pod of
   the URL's namespace (the pod's name and UID are in the token's claims, signed by the API server);
3. that pod is, in the operator's own watch of the job's pods, a worker of rank 0 that this job
   owns (a pod the operator has not seen yet: 409, the trainer retries);
4. the body is at most contract.MAX_REPORT_BYTES and every record is one that changes the status.

The operator then merge-patches only `status.progress` (stamped with the reporting pod's gang
generation, which the progress deadline uses across a failover), `status.preflight`,
`status.lastCheckpoint` and `status.hangStacks` (stamped too: a hang's stacks are this gang's): whatever a worker sends, nothing else of the status, and nothing the
operator creates, follows from it. Worker pods hold no permission on the Kubernetes API.

Each worker pod's supervisor POSTs its launch reports (api.launches) to `.../launches`, taken on
steps 1 to 3 for any worker of the job; the answer is its order (core.in_place), held up to
launches.POLL_SECONDS while the order is what the supervisor already does. What a supervisor says
(torchrun exited, and how) counts as the same exit of its container would: it can restart the gang
in place, never make the operator create anything a container's exit could not.

TokenReviews are cached for TOKEN_CACHE_SECONDS per accepted token (one review a minute per job, not one per
record): a token revoked by deleting its pod is refused within that time, as the pod is gone from
the watch at once. A refused token is not cached, so that made-up tokens never push out good ones.

What a job's own code can do to the endpoint is bounded (report_limits.py): connections in all and per pod,
handshake and idle time, requests per pod before any TokenReview, TokenReviews in flight.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import ssl
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp.web
from pydantic import ValidationError

from dtrain_operator.api import contract
from dtrain_operator.api.launches import (
    ACTION_RUN,
    ACTION_STOP,
    ACTION_WAIT,
    POLL_SECONDS,
    STATE_RUNNING,
    LaunchOrder,
    LaunchReport,
)
from dtrain_operator.api.record_patches import MAX_TRAINER_FIELD_BYTES, merge_patches
from dtrain_operator.api.records import checked_record, status_patch
from dtrain_operator.controller.kube import ApiError, KubeClient
from dtrain_operator.controller.report_limits import (
    MAX_PENDING_REVIEWS,
    AdmittedProtocol,
    ConnectionLimits,
    PeerRateLimiter,
    ServingLimits,
    peer_of,
)
from dtrain_operator.controller.report_tls import RENEW_SECONDS, ReportTLS
from dtrain_operator.core.observation import PodObservation

logger = logging.getLogger(__name__)

DEFAULT_LIMITS = ServingLimits()
# pydantic's errors of a value over its bound: the record is too large (413), not malformed (400).
SIZE_ERRORS = frozenset({"too_long", "string_too_long"})

TOKEN_CACHE_SECONDS = 60.0
TOKEN_CACHE_SIZE = 4096
POD_NAME_CLAIM = "authentication.kubernetes.io/pod-name"
POD_UID_CLAIM = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
ROUTE = "/v1/namespaces/{namespace}/" + contract.PLURAL + "/{name}/records"
LAUNCH_ROUTE = "/v1/namespaces/{namespace}/" + contract.PLURAL + "/{name}/launches"


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class BoundPod:
    """The pod a token is bound to, as the API server's TokenReview says."""

    namespace: str
    name: str
    uid: str


class Jobs(Protocol):
    """What the report endpoint asks of the controller: its watch of the jobs and their pods, and the status write."""

    def job_uid(self, namespace: str, name: str) -> str | None: ...

    def pod_of(self, namespace: str, name: str, pod_uid: str) -> PodObservation | None: ...

    async def write_reports(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None: ...

    def launch_reported(self, namespace: str, name: str, pod: PodObservation, report: LaunchReport) -> None: ...

    def launch_order(self, namespace: str, name: str, pod: PodObservation) -> LaunchOrder | None: ...

    async def launch_decided(self, namespace: str, name: str, timeout: float) -> None: ...


class Reviewer(Protocol):
    async def review(self, token: str) -> BoundPod: ...


class TokenReviewer:
    """TokenReview for the operator's audience, with a small cache of the answers."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client
        self._cache: OrderedDict[str, tuple[float, BoundPod]] = OrderedDict()
        self._pending = 0

    async def review(self, token: str) -> BoundPod:
        """The pod the token is bound to; raises Refused(401) for a token the API server does not accept, and
        Refused(503) while MAX_PENDING_REVIEWS are in flight already."""
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        if self._pending >= MAX_PENDING_REVIEWS:
            raise Refused(503, "too many token reviews in flight; try again")
        self._pending += 1
        try:
            answer = await self._ask(token)
        finally:
            self._pending -= 1
        if isinstance(answer, str):
            raise Refused(401, answer)
        self._cache[key] = (time.monotonic() + TOKEN_CACHE_SECONDS, answer)
        while len(self._cache) > TOKEN_CACHE_SIZE:
            self._cache.popitem(last=False)
        return answer

    async def _ask(self, token: str) -> BoundPod | str:
        try:
            review = await self._client.review_token(token, contract.OPERATOR_TOKEN_AUDIENCE)
        except ApiError as exc:
            raise Refused(503, f"the API server did not answer the TokenReview ({exc.status} {exc.reason})") from exc
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return f"the token is not valid for {contract.OPERATOR_TOKEN_AUDIENCE} ({status.get('error') or 'not authenticated'})"
        if contract.OPERATOR_TOKEN_AUDIENCE not in (status.get("audiences") or []):
            return f"the token's audience is not {contract.OPERATOR_TOKEN_AUDIENCE}"
        user = status.get("user") or {}
        username = str(user.get("username") or "")
        extra = user.get("extra") or {}
        pod_name = (extra.get(POD_NAME_CLAIM) or [""])[0]
        pod_uid = (extra.get(POD_UID_CLAIM) or [""])[0]
        if not username.startswith(SERVICE_ACCOUNT_PREFIX) or not pod_name or not pod_uid:
            return "the token is not a service-account token bound to a pod"
        namespace = username[len(SERVICE_ACCOUNT_PREFIX) :].split(":", 1)[0]
        return BoundPod(namespace, pod_name, pod_uid)


def merged_patch(records: Any, generation: int | None) -> dict[str, Any]:
    """The status merge patch of records taken in order: as if each had been applied in turn. A record over one of
    its bounds (api.records) is refused with 413, one of the wrong shape with 400, naming the field."""
    if not isinstance(records, list) or not records:
        raise Refused(400, 'the body must be {"records": [...]} with at least one record')
    patch: dict[str, Any] = {}
    for index, record in enumerate(records):
        try:
            checked = checked_record(record)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            status = 413 if any(e["type"] in SIZE_ERRORS for e in exc.errors()) else 400
            raise Refused(status, f"records[{index}].{where}: {error['msg']}") from exc
        part = status_patch(record) if checked is not None else None
        if part is None:
            raise Refused(
                400, f"records[{index}] is not a record that changes the status (progress, preflight, checkpoint, hang)"
            )
        if generation is not None:
            part = {field: {**value, "gangGeneration": generation} if field in ("progress", "hangStacks") else value
                    for field, value in part.items()}
        patch = merge_patches(patch, part)
    for field, value in patch.items():
        size = len(json.dumps(value).encode())
        if size > MAX_TRAINER_FIELD_BYTES:
            raise Refused(413, f"status.{field} would be {size} bytes; at most {MAX_TRAINER_FIELD_BYTES}")
    return patch


class ReportServer:
    """The HTTPS endpoint; `jobs` None makes it a standby's, answering 503 to every report."""

    def __init__(
        self, tls: ReportTLS, port: int, jobs: Jobs | None = None, reviewer: Reviewer | None = None, host: str = "0.0.0.0",
        limits: ServingLimits = DEFAULT_LIMITS,
    ) -> None:
        self._tls = tls
        self._port = port
        self._host = host
        self._jobs = jobs
        self._reviewer = reviewer
        self._runner: aiohttp.web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._renewing: asyncio.Task[None] | None = None
        self._limits = limits
        self.connections = ConnectionLimits(limits.connections, limits.connections_per_peer)
        self._rate = PeerRateLimiter(limits.peer_rate, limits.peer_burst)
        self._stopping = asyncio.Event()  # held launch requests are answered at once
        self.taken = 0
        # Refusals by HTTP status: counts, so that a standby answering 503 for months holds a few numbers.
        self.refused: Counter[int] = Counter()

    async def start(self) -> None:
        app = aiohttp.web.Application(client_max_size=contract.MAX_REPORT_BYTES)
        app.router.add_post(ROUTE, self._post)
        app.router.add_post(LAUNCH_ROUTE, self._post_launch)
        self._runner = aiohttp.web.AppRunner(app, access_log=None, keepalive_timeout=self._limits.idle_seconds)
        await self._runner.setup()
        handlers = self._runner.server
        assert handlers is not None
        context = self._tls.server_context()
        # Served by hand rather than by a TCPSite: the handshake's time and the connections are bounded.
        serve = functools.partial(
            asyncio.get_running_loop().create_server,
            lambda: AdmittedProtocol(handlers(), self.connections), self._host, self._port,
            ssl=context, ssl_handshake_timeout=self._limits.handshake_seconds, reuse_address=True,
        )
        if sys.version_info >= (3, 11):
            # A pod gone without a word (its network namespace removed) answers no TLS close: its connection's place
            # is free after the handshake's time, not asyncio's 30 s (a new pod may be given its address meanwhile).
            self._server = await serve(ssl_shutdown_timeout=self._limits.handshake_seconds)
        else:  # Python 3.10 has no bound on the TLS close (the operator image runs 3.11).
            self._server = await serve()
        self._renewing = asyncio.create_task(self._renew(context), name="report-certificate")

    async def _renew(self, context: ssl.SSLContext) -> None:
        """A new serving certificate before the one served expires (report_tls.py), for as long as this serves."""
        wait = RENEW_SECONDS
        while True:
            await asyncio.sleep(wait)
            wait = self._tls.renew(context)
            logger.info("report endpoint: serving a renewed certificate")

    async def stop(self) -> None:
        self._stopping.set()
        if self._renewing is not None:
            self._renewing.cancel()
            await asyncio.wait([self._renewing])  # ended here, not left pending on a loop its owner may stop next
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _post(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        try:
            await self._take(request, namespace, name)
        except Refused as refused:
            if refused.status in (401, 403):
                logger.warning("%s/%s: a progress report was refused (%d): %s", namespace, name, refused.status, refused)
            self.refused[refused.status] += 1
            return aiohttp.web.json_response({"message": str(refused)}, status=refused.status)
        self.taken += 1
        return aiohttp.web.Response(status=204)

    async def _worker(self, request: aiohttp.web.Request, namespace: str, name: str) -> tuple[Jobs, PodObservation]:
        """The worker pod of the job that the request's token is bound to (steps 1 to 3 of the module's docstring)."""
        if self._jobs is None or self._reviewer is None:
            raise Refused(503, "this operator replica is a standby; the leader takes reports")
        if not self._rate.allow(peer_of(request)):
            raise Refused(429, f"more than {self._limits.peer_rate:g} requests a second from {peer_of(request)}; slow down")
        authorization = request.headers.get("Authorization", "")
        if not authorization.startswith("Bearer ") or not authorization[7:].strip():
            raise Refused(401, "no bearer token (a worker sends its pod's projected token for the operator)")
        pod = await self._reviewer.review(authorization[7:].strip())
        if pod.namespace != namespace:
            raise Refused(403, f"the token is bound to a pod of namespace {pod.namespace}, not {namespace}")
        job_uid = self._jobs.job_uid(namespace, name)
        if job_uid is None:
            raise Refused(404, f"no DistributedTraining {namespace}/{name}")
        observed = self._jobs.pod_of(namespace, name, pod.uid)
        if observed is None:
            raise Refused(409, f"pod {pod.name} is not (yet) known as a pod of {namespace}/{name}")
        if observed.owner_uid != job_uid or observed.role != contract.ROLE_WORKER:
            raise Refused(403, f"pod {pod.name} is not a worker of {namespace}/{name}")
        return self._jobs, observed

    async def _take(self, request: aiohttp.web.Request, namespace: str, name: str) -> None:
        jobs, observed = await self._worker(request, namespace, name)
        if observed.rank != 0:
            raise Refused(403, f"pod {observed.name} is not the rank-0 worker of {namespace}/{name}: only it reports")
        document = await _json_body(request)
        records = document.get("records") if isinstance(document, dict) else None
        patch = merged_patch(records, observed.generation)
        try:
            await jobs.write_reports(namespace, name, patch)
        except ApiError as exc:
            raise Refused(404 if exc.not_found else 503, f"the status write failed ({exc.status} {exc.reason})") from exc

    async def _post_launch(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        """A supervisor's report (api.launches); the answer, its order, is held while it says "go on as you are"."""
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        try:
            jobs, pod = await self._worker(request, namespace, name)
            try:
                report = LaunchReport.model_validate(await _json_body(request))
            except ValidationError as exc:
                raise Refused(400, f"not a launch report: {exc.errors()[0].get('msg')}") from exc
        except Refused as refused:
            if refused.status in (401, 403):
                logger.warning("%s/%s: a launch report was refused (%d): %s", namespace, name, refused.status, refused)
            self.refused[refused.status] += 1
            return aiohttp.web.json_response({"message": str(refused)}, status=refused.status)
        jobs.launch_reported(namespace, name, pod, report)
        deadline = time.monotonic() + POLL_SECONDS
        while True:
            pod = jobs.pod_of(namespace, name, pod.uid) or pod  # as the watch shows it now (relabelled?)
            order = jobs.launch_order(namespace, name, pod)
            left = deadline - time.monotonic()
            if (order is not None and not _in_effect(order, report)) or left <= 0 or self._stopping.is_set():
                break
            await _first(jobs.launch_decided(namespace, name, left), self._stopping.wait())
        self.taken += 1
        if order is None:
            order = LaunchOrder(action=ACTION_WAIT, generation=report.generation, why="the operator has not decided yet")
        return aiohttp.web.json_response(order.model_dump(by_alias=True, exclude_none=True))


async def _first(*awaitables: Awaitable[Any]) -> None:
    """Wait for the first of them; cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()


def _in_effect(order: LaunchOrder, report: LaunchReport) -> bool:
    """The supervisor already does what the order says: nothing to tell it yet."""
    if order.action == ACTION_RUN:
        return report.state == STATE_RUNNING and report.generation == order.generation
    if order.action == ACTION_STOP:
        return report.state != STATE_RUNNING
    return order.action == ACTION_WAIT


async def _json_body(request: aiohttp.web.Request) -> Any:
    try:
        body = await request.read()
    except aiohttp.web.HTTPRequestEntityTooLarge as exc:
        raise Refused(413, f"a report is at most {contract.MAX_REPORT_BYTES} bytes") from exc
    try:
        return json.loads(body)
    except ValueError as exc:
        raise Refused(400, f"the body is not JSON ({exc})") from exc
    except RecursionError as exc:  # nested deeper than the parser goes: no record is
        raise Refused(400, "the body is nested too deeply to be a report") from exc
