"""The operator's own API calls, and nothing else: create (a 409 read back), get, delete, status patches,
Events. Requests go through the official client's async REST layer (kubernetes.aio: its configuration
loading, auth and connection pool), with plain dicts in and out, behind a client-side rate limit.

kopf does the watching with the same credentials (`connection_info`).

kopf's own client is internal (kopf._cogs) and makes only the calls kopf needs (watches, patches of
the handled object, Events); creating children, deleting them, reading them back after a 409 and
TokenReviews need a client anyway. The client-side rate limit (`--qps/--burst`, as client-go's)
is what decides how fast a burst of jobs gets its pods: bench/operator_scale.py measured 200
jobs at `--qps 20` (client-go's default) at p99 76.9 s from create to pods, and 1.88 s at the
shipped `--qps 500` (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import aiohttp
import kopf
from kubernetes.aio.client.api_client import ApiClient
from kubernetes.aio.client.configuration import Configuration
from kubernetes.aio.config import ConfigException, load_incluster_config, load_kube_config

from dtrain_operator.api import contract
from dtrain_operator.api.redaction import redact_text

logger = logging.getLogger(__name__)

USER_AGENT = "dtrain-operator/0.1.0"
REQUEST_TIMEOUT_SECONDS = 30.0
# As client-go's REST client: a 429 (or a 5xx with Retry-After) is retried after the time the
# server asks for, up to 10 times, before the request fails. The wait is capped: a server asking
# for longer gets the reconcile's own back-off instead.
MAX_RETRY_AFTER_ATTEMPTS = 10
MAX_RETRY_AFTER_SECONDS = 30.0

class ApiError(Exception):
    """An API request that did not succeed: the HTTP status (0: no answer), reason and message,
    and the seconds the server asked the client to wait before retrying (Retry-After), if it did."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class RequestObserver(Protocol):
    """Told about every request (metrics)."""

    def api_request(self, verb: str, resource: str, status: int) -> None: ...


class RateLimiter:
    """A token bucket: `qps` requests a second on average, bursts of up to `burst`."""

    def __init__(self, qps: float, burst: int) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("--qps must be above 0 and --burst at least 1")
        self._qps = qps
        self._burst = float(burst)
        self._tokens = float(burst)
        self._updated = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self._burst, self._tokens + (now - self._updated) * self._qps)
                self._updated = now
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return
                await asyncio.sleep((1.0 - self._tokens) / self._qps)


async def load_configuration() -> Configuration:
    """In-cluster credentials (the operator's service account), else the kubeconfig ($KUBECONFIG)."""
    configuration = Configuration()
    try:
        load_incluster_config(client_configuration=configuration)
        logger.info("using the in-cluster service account")
    except ConfigException:
        try:
            await load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
        except (ConfigException, OSError) as exc:
            raise kopf.LoginError(
                f"no Kubernetes credentials: not in a cluster, and no usable kubeconfig ({exc}). "
                "Set KUBECONFIG or run in a pod with a service account"
            ) from exc
        logger.info("using the kubeconfig's current context (%s)", configuration.host)
    return configuration


async def connection_info(configuration: Configuration) -> kopf.ConnectionInfo:
    """The same credentials for kopf's own watch connections."""
    header = await configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
    scheme, token = (header.split(" ", 1) if " " in header else (None, header)) if header else (None, None)
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def _retry_after(status: int, header: str | None) -> float | None:
    """Seconds to wait before retrying, from Retry-After on a 429 or a 5xx (as client-go reads it:
    whole seconds; a 429 without the header waits 1 s)."""
    if status != 429 and status < 500:
        return None
    if header is None:
        return 1.0 if status == 429 else None
    try:
        seconds = int(header.strip())
    except ValueError:
        return 1.0 if status == 429 else None
    return float(max(seconds, 0))


def object_path(api_version: str, kind: str, namespace: str, name: str = "", subresource: str = "") -> str:
    prefix, plural = contract.RESOURCES[(api_version, kind)]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


def _honouring_retry_after(
    send: Callable[..., Awaitable[dict[str, Any]]],
) -> Callable[..., Awaitable[dict[str, Any]]]:
    """A request that the API server asked to repeat later (Retry-After) is sent again, a few times,
    after the wait it asked for, unless the wait is too long."""

    @functools.wraps(send)
    async def retrying(self: Any, method: str, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        for attempt in range(MAX_RETRY_AFTER_ATTEMPTS + 1):
            try:
                return await send(self, method, path, *args, **kwargs)
            except ApiError as exc:
                wait = exc.retry_after
                if wait is None or attempt == MAX_RETRY_AFTER_ATTEMPTS or wait > MAX_RETRY_AFTER_SECONDS:
                    raise
                logger.debug("%s %s: %s; retrying in %g s as the server asks", method, path, exc.status, wait)
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    return retrying

class KubeClient:
    """Plain-dict access to the objects the operator owns, rate-limited and counted."""

    def __init__(self, configuration: Configuration, limiter: RateLimiter, observer: RequestObserver) -> None:
        # As kopf does: no proxy or netrc lookups from the environment (the client would run two
        # thread-pool lookups for every request).
        configuration.client_session_kwargs = {"trust_env": False}
        self._client = ApiClient(configuration)
        self._client.user_agent = USER_AGENT
        self._limiter = limiter
        self._observer = observer

    def use_configuration(self, configuration: Configuration) -> None:
        """Fresh credentials (a new login); connections are reused."""
        configuration.client_session_kwargs = {"trust_env": False}
        self._client.configuration = configuration

    async def close(self) -> None:
        await self._client.close()

    @_honouring_retry_after
    async def _request(
        self,
        method: str,
        path: str,
        verb: str,
        resource: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        await self._limiter.acquire()
        # The body is plain JSON already: the client's model serialisation is skipped.
        method_, url, headers, _, _ = await self._client.param_serialize(
            method=method,
            resource_path=path,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            response = await self._client.call_api(
                method_, url, header_params=headers, body=body, _request_timeout=REQUEST_TIMEOUT_SECONDS
            )
            data = await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self._observer.api_request(verb, resource, 0)
            raise ApiError(0, "ConnectionError", str(exc) or type(exc).__name__) from exc
        self._observer.api_request(verb, resource, response.status)
        try:
            decoded = json.loads(data) if data else {}
        except ValueError:
            decoded = {}
        if not 200 <= response.status < 300:
            raise ApiError(
                response.status,
                str(decoded.get("reason") or response.reason or ""),
                str(decoded.get("message") or data[:200].decode(errors="replace")),
                _retry_after(response.status, response.headers.get("Retry-After")),
            )
        return decoded if isinstance(decoded, dict) else {}

    async def create(self, obj: Mapping[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Create `obj`; with `dry_run`, only the API server's verdict (admitted and validated, never stored;
        strict about unknown fields where the job's own fields go: contract.dry_run_query)."""
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"])
        if dry_run:
            path += "?" + "&".join(f"{key}={value}" for key, value in contract.dry_run_query(obj["kind"]).items())
        return await self._request("POST", path, "create", contract.RESOURCES[(obj["apiVersion"], obj["kind"])][1], obj)

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        path = object_path(api_version, kind, namespace, name)
        return await self._request("GET", path, "get", contract.RESOURCES[(api_version, kind)][1])

    async def review_token(self, token: str, audience: str) -> dict[str, Any]:
        """A TokenReview of `token` for `audience` (cluster-scoped: a path of its own)."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": token, "audiences": [audience]}}
        return await self._request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", "create", "tokenreviews", review)

    async def namespace_labels(self, name: str) -> dict[str, str]:
        """The labels of a namespace (cluster-scoped: a path of its own)."""
        namespace = await self._request("GET", f"/api/v1/namespaces/{name}", "get", "namespaces")
        return dict((namespace.get("metadata") or {}).get("labels") or {})

    async def create_or_read(self, obj: Mapping[str, Any], read_first: bool = False) -> tuple[dict[str, Any], bool]:
        """Create `obj`; when it already exists (409), read it back. Returns (object, created). `read_first`, for
        an object that most likely exists: read it, and create it only when it is not there (one request, not two)."""
        meta = obj["metadata"]
        if read_first:
            try:
                return await self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]), False
            except ApiError as exc:
                if not exc.not_found:
                    raise
        try:
            return await self.create(obj), True
        except ApiError as exc:
            if not exc.conflict:
                raise
        return await self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]), False

    async def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        uid: str | None = None,
        propagation: str | None = None,
        grace_seconds: int | None = None,
    ) -> None:
        """Delete an object; with `uid`, only that incarnation of the name (a precondition).
        `grace_seconds` overrides a pod's terminationGracePeriodSeconds (0: a force delete)."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        if propagation:
            options["propagationPolicy"] = propagation
        path = object_path(api_version, kind, namespace, name)
        await self._request("DELETE", path, "delete", contract.RESOURCES[(api_version, kind)][1], options)

    async def patch_status(self, namespace: str, name: str, status_patch: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch a DistributedTraining's status (custom resources take no strategic merge)."""
        path = object_path(contract.API_VERSION, contract.KIND, namespace, name, "status")
        return await self._request(
            "PATCH",
            path,
            "patch",
            f"{contract.PLURAL}/status",
            {"status": dict(status_patch)},
            content_type="application/merge-patch+json",
        )

    async def patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch an object (the operator's own annotation on a DistributedTraining)."""
        path = object_path(api_version, kind, namespace, name)
        return await self._request(
            "PATCH", path, "patch", contract.RESOURCES[(api_version, kind)][1], dict(patch),
            content_type="application/merge-patch+json",
        )

    async def post_event(
        self, involved: Mapping[str, Any], event_type: str, reason: str, message: str, instance: str
    ) -> dict[str, Any]:
        """A core/v1 Event about `involved` (a DistributedTraining body). Returns the Event created."""
        meta = involved["metadata"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", contract.API_VERSION),
                "kind": involved.get("kind", contract.KIND),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
            },
            "type": event_type,
            "reason": reason,
            "message": redact_text(message)[:1024],
            "source": {"component": "dtrain-operator"},
            "reportingComponent": "dtrain.dev/operator",
            "reportingInstance": instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        return await self._request("POST", object_path("v1", "Event", meta["namespace"]), "create", "events", event)

    async def repeat_event(self, namespace: str, name: str, count: int, message: str) -> dict[str, Any]:
        """The same Event seen again: its count and last-seen time (and newest message), as Kubernetes'
        own event recorder does instead of posting a new one."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        patch = {"count": count, "lastTimestamp": now, "message": message[:1024]}
        return await self.patch("v1", "Event", namespace, name, patch)
