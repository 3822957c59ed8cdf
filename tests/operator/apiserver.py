"""A Kubernetes API server for the operator's tests: kmock's KubernetesEmulator, extended where the
operator relies on real API-server behaviour. Each extension is small and stands for one behaviour:

- resourceVersion: one counter for every write, on objects, list metadata and watch events;
  `uid`, `creationTimestamp` and `generation` (bumped when `spec` changes) set on create;
- status subresource: PATCH .../status changes only `status`; a PATCH of the object leaves it alone;
- watch (watches.py): from a resourceVersion, the events since then are replayed (410 Gone when older than the
  event log), as the API server's watch cache does; without one, the current objects come as ADDED;
  `timeoutSeconds` ends the stream;
- lists and watches filter by `labelSelector`; lists carry `kind` and `apiVersion`;
- DELETE honours `preconditions.uid` (409) and finalizers (`deletionTimestamp`; a pod's is the
  request's time plus its grace period, with `deletionGracePeriodSeconds`), and deleting an
  object deletes its dependents (ownerReferences: the garbage collector, background propagation);
  a pod held by the test kubelet's graceful termination (KUBELET_FINALIZER, see kubelet.py) goes at
  once on a force delete (`gracePeriodSeconds: 0`), as a real pod whose kubelet no longer confirms;
- faults (faults.py): chosen requests answered with an error, or held at a gate; watch streams dropped or
  stalled (left open but silent, as a dead connection); an error with `retry_after` carries the
  `Retry-After` header and `details.retryAfterSeconds`, as the API server's 429 (priority and
  fairness, max-in-flight) does;
- admission: hooks (`admission`, e.g. admission_refusals.py) that check or refuse an object on
  create and update, before it is stored; a DistributedTraining is stored as sent (no CRD schema
  or CEL rules, as with a CRD from before them: the real API server's are `make e2e`'s);
- GET of one Namespace (`/api/v1/namespaces/NAME`), which kmock reads as a namespace prefix;
- TokenReview: a token the test bound to a pod (`tokens`) is authenticated for the operator's audience
  with the pod's name and UID in its claims, as the API server answers for a projected token; any
  other is not (the real TokenReview is `make e2e`'s scenario `tokens`);
- a recorder (calls.py) of every resource request as (verb, apiGroup, resource, subresource), by user agent,
  for comparing the operator's calls with its RBAC rules.

kmock still does the HTTP serving, request parsing, API discovery and object storage
(`server.objects[...]` keeps every version of every object for assertions). The private parts of
kmock that the extensions override or use are named, and checked, in kmock_adapter.py.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import re
import secrets
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock

from dtrain_operator.api import contract

from .calls import Call, rbac_verb
from .faults import Faults, Throttled
from .kmock_adapter import KubernetesError, Payload, Request, is_dry_run
from .watches import Watches, selector_matches

EVENT_LOG_SIZE = 50_000
_ONE_NAMESPACE = re.compile(r"^/api/v1/namespaces/([a-z0-9-]+)$")
# The finalizer with which tests/operator/kubelet.py holds a deleted pod while it "terminates".
KUBELET_FINALIZER = "kubelet.test.dtrain.dev/graceful-termination"

# The resources the operator and the tests use: (group/version/plural, kind, has a status subresource).
RESOURCES = [
    ("v1/pods", "Pod", True),
    ("v1/services", "Service", True),
    ("v1/configmaps", "ConfigMap", False),
    ("v1/secrets", "Secret", False),
    ("v1/events", "Event", False),
    ("v1/namespaces", "Namespace", True),
    ("batch/v1/jobs", "Job", True),
    ("networking.k8s.io/v1/networkpolicies", "NetworkPolicy", False),
    ("coordination.k8s.io/v1/leases", "Lease", False),
    (f"{contract.API_VERSION}/{contract.PLURAL}", contract.KIND, True),
    ("scheduling.k8s.io/v1alpha2/podgroups", "PodGroup", True),
    ("scheduling.volcano.sh/v1beta1/podgroups", "PodGroup", True),
    ("scheduling.x-k8s.io/v1alpha1/podgroups", "PodGroup", True),
    ("authentication.k8s.io/v1/tokenreviews", "TokenReview", False),
]
CLUSTER_SCOPED = {"namespaces", "tokenreviews"}
NAMESPACES = kmock.resource("v1/namespaces")


def now_rfc3339(later_seconds: float = 0) -> str:
    moment = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=later_seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# A pod's terminationGracePeriodSeconds when its spec has none (the API server's default).
DEFAULT_POD_GRACE_SECONDS = 30


def deletion_marks(resource: Any, raw: dict[str, Any], grace_option: Any) -> dict[str, Any]:
    """What a graceful delete writes on an object its finalizers keep. For a pod, as the API server's pod
    strategy does: the grace period asked for, else the pod's own, and a deletionTimestamp that far ahead,
    when the kubelet kills what is left; anything else is marked at the time of the request."""
    if getattr(resource, "plural", None) != "pods":
        marks: dict[str, Any] = {"deletionTimestamp": now_rfc3339()}
        if isinstance(grace_option, int):
            marks["deletionGracePeriodSeconds"] = grace_option
        return marks
    own = (raw.get("spec") or {}).get("terminationGracePeriodSeconds")
    grace = grace_option if isinstance(grace_option, int) else own if isinstance(own, int) else DEFAULT_POD_GRACE_SECONDS
    return {"deletionTimestamp": now_rfc3339(grace), "deletionGracePeriodSeconds": grace}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (strategic merge patches are applied the same way: lists replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


@attrs.define(kw_only=True)
class ApiServer(Watches, kmock.KubernetesEmulator):
    """kmock's KubernetesEmulator with the behaviour listed in this module's docstring."""

    faults: Faults = attrs.field(factory=Faults, init=False)
    calls: list[tuple[str, Call]] = attrs.field(factory=list, init=False)
    # gracePeriodSeconds of each DELETE that gave one, by (namespace, name).
    deletion_graces: dict = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=0, init=False)
    _events: collections.deque = attrs.field(factory=lambda: collections.deque(maxlen=EVENT_LOG_SIZE), init=False)
    _wakeup: asyncio.Event | None = attrs.field(default=None, init=False)
    _status_resources: set = attrs.field(factory=set, init=False)
    _kinds: dict = attrs.field(factory=dict, init=False)
    # Called on create and update as hook(request, new, old) -> the object to store (or raise KubernetesError).
    admission: list[Callable[..., dict[str, Any]]] = attrs.field(factory=list, init=False)
    # TokenReview's answers: token -> (namespace, pod name, pod UID) it is bound to.
    tokens: dict[str, tuple[str, str, str]] = attrs.field(factory=dict, init=False)

    def admit(self, request: Request, new: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        for hook in self.admission:
            new = hook(request, new, old)
        return new

    def declare_resources(self) -> None:
        for name, kind, has_status in RESOURCES:
            resource = kmock.resource(name)
            plural = name.rsplit("/", 1)[-1]
            self.resources[name] = kmock.ResourceInfo(
                kind=kind,
                namespaced=plural not in CLUSTER_SCOPED,
                verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
                subresources={"status"} if has_status else set(),
            )
            self._kinds[resource] = (kind, name.rsplit("/", 1)[0])
            if has_status:
                self._status_resources.add(resource)

    # --- What the operator asked ---------------------------------------------------------------

    def calls_by(self, *agents: str) -> set[Call]:
        """Resource requests made by clients whose User-Agent starts with one of `agents`."""
        return {call for agent, call in self.calls if agent.startswith(agents)}

    def count_calls(self, agents: Iterable[str], **where: str) -> int:
        prefixes = tuple(agents)
        return sum(
            1
            for agent, call in self.calls
            if agent.startswith(prefixes) and all(getattr(call, k) == v for k, v in where.items())
        )

    # --- Request handling ------------------------------------------------------------------------

    async def _handle(self, request: Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        one_namespace = _ONE_NAMESPACE.match(request.url.path) if request.method == "GET" else None
        if one_namespace:
            return self._serve_namespace(request, one_namespace.group(1))
        if resource is None or not resource.plural or request.action is None:
            return await super()._handle(request)  # discovery and other paths
        agent = request.headers.get("User-Agent", "")
        self.calls.append(
            (agent, Call(rbac_verb(request), resource.group or "", resource.plural, request.subresource or ""))
        )
        await self.faults.intercept(request)
        if resource.plural == "tokenreviews" and request.action == kmock.action.CREATE:
            return aiohttp.web.json_response(self._review(request.data), status=201)
        if request.action == kmock.action.CREATE:
            return aiohttp.web.json_response(await self._create(request), status=201)
        if request.action == kmock.action.UPDATE:
            return aiohttp.web.json_response(await self._patch(request))
        if request.action == kmock.action.DELETE:
            return aiohttp.web.json_response(await self._delete(request))
        return await super()._handle(request)

    def _review(self, review: Any) -> dict[str, Any]:
        spec = review.get("spec") or {} if isinstance(review, dict) else {}
        bound = self.tokens.get(str(spec.get("token")))
        if bound is None:
            status: dict[str, Any] = {"authenticated": False, "error": "invalid bearer token"}
        else:
            namespace, pod, uid = bound
            status = {
                "authenticated": True,
                "audiences": list(spec.get("audiences") or []),
                "user": {
                    "username": f"system:serviceaccount:{namespace}:{contract.DEFAULT_WORKER_SERVICE_ACCOUNT}",
                    "extra": {"authentication.kubernetes.io/pod-name": [pod], "authentication.kubernetes.io/pod-uid": [uid]},
                },
            }
        return {**review, "status": status}

    def _serve_namespace(self, request: Request, name: str) -> aiohttp.web.StreamResponse:
        self.calls.append((request.headers.get("User-Agent", ""), Call("get", "", "namespaces", "")))
        found = self._current((NAMESPACES, None, name))  # cluster-scoped: stored without a namespace
        if found is None:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                    "message": f'namespaces "{name}" not found'}
            return aiohttp.web.json_response(body, status=404)
        return aiohttp.web.json_response(found)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        response = await super()._render_error(exc)
        if isinstance(exc, Throttled):
            response.headers["Retry-After"] = str(exc.retry_after)
        return response

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _current(self, key: tuple[Any, str | None, str]) -> dict[str, Any] | None:
        if key not in self.objects:
            return None
        obj = self.objects[key]  # type: ignore[index]
        return None if obj.deleted else dict(obj.last.raw)

    def _store(self, key: tuple[Any, str | None, str], raw: dict[str, Any]) -> None:
        if key in self.objects:
            self.objects[key].history.append(raw)  # type: ignore[index]
        else:
            self.objects[key] = raw  # type: ignore[index]

    async def _create(self, request: Request) -> dict[str, Any]:
        raw = copy.deepcopy(request.data) if isinstance(request.data, dict) else None
        if raw is None:
            raise KubernetesError(400, "BadRequest", "the body is not a JSON object")
        meta = raw.setdefault("metadata", {})
        namespace = None if request.resource.plural in CLUSTER_SCOPED else (request.namespace or meta.get("namespace"))
        name = meta.get("name") or (meta.get("generateName", "") + secrets.token_hex(3)[:5])
        key = (request.resource, namespace, name)
        meta["name"] = name
        raw = self.admit(request, raw, None)
        meta = raw.setdefault("metadata", {})
        async with self._lock:
            if self._current(key) is not None:
                raise KubernetesError(409, "AlreadyExists", f'{request.resource.plural} "{name}" already exists')
            if is_dry_run(request):
                return raw  # admitted and answered, never stored nor watched
            meta.update(
                name=name,
                uid=str(uuid.uuid4()),
                creationTimestamp=now_rfc3339(),
                resourceVersion=str(self._next_rv()),
                generation=1,
            )
            if namespace is not None:
                meta["namespace"] = namespace
            if request.resource.plural == "pods":
                raw.setdefault("status", {"phase": "Pending", "qosClass": "BestEffort"})
            elif request.resource in self._status_resources:
                raw.pop("status", None)  # a create never sets a status subresource's status
            self._store(key, raw)
            self._emit("ADDED", request.resource, raw)
        return raw

    async def _patch(self, request: Request) -> dict[str, Any]:
        key = (request.resource, request.namespace, request.name)
        content_type = request.headers.get("Content-Type", "")
        async with self._lock:
            old = self._current(key)
            if old is None:
                raise KubernetesError(404, "NotFound", f'{request.resource.plural} "{request.name}" not found')
            if "json-patch" in content_type:
                new = jsonpatch.apply_patch(copy.deepcopy(old), request.data)
            else:
                patch = dict(request.data or {})
                wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
                if wanted_rv is not None and str(wanted_rv) != old["metadata"]["resourceVersion"]:
                    raise KubernetesError(409, "Conflict", "the object has been modified; resourceVersion differs")
                if request.subresource == "status":
                    patch = {"status": patch.get("status")}
                elif request.resource in self._status_resources:
                    patch.pop("status", None)
                new = merge_patch(old, patch)
            new = self.admit(request, new, old)
            meta = new["metadata"]
            for field in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
                if field in old["metadata"]:
                    meta[field] = old["metadata"][field]
            if new.get("spec") != old.get("spec"):
                meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
            meta["resourceVersion"] = str(self._next_rv())
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                self._store(key, new)
                await self._remove(key, new)
            else:
                self._store(key, new)
                self._emit("MODIFIED", request.resource, new)
        return new

    async def _delete(self, request: Request) -> dict[str, Any]:
        key = (request.resource, request.namespace, request.name)
        options = request.data if isinstance(request.data, dict) else {}
        preconditions = options.get("preconditions") or {}
        if isinstance(options.get("gracePeriodSeconds"), int):
            self.deletion_graces[(request.namespace, request.name)] = options["gracePeriodSeconds"]
        async with self._lock:
            raw = self._current(key)
            if raw is None:
                raise KubernetesError(404, "NotFound", f'{request.resource.plural} "{request.name}" not found')
            meta = raw["metadata"]
            if preconditions.get("uid") and preconditions["uid"] != meta.get("uid"):
                raise KubernetesError(409, "Conflict", "Precondition failed: UID in precondition does not match")
            if options.get("gracePeriodSeconds") == 0 and KUBELET_FINALIZER in (meta.get("finalizers") or []):
                raw = copy.deepcopy(raw)
                meta = raw["metadata"]
                meta["finalizers"] = [f for f in meta["finalizers"] if f != KUBELET_FINALIZER]
            if meta.get("finalizers"):
                if not meta.get("deletionTimestamp"):
                    # The kubelet honours deletionGracePeriodSeconds over terminationGracePeriodSeconds.
                    marks = deletion_marks(request.resource, raw, options.get("gracePeriodSeconds"))
                    raw = merge_patch(raw, {"metadata": marks})
                    raw["metadata"]["resourceVersion"] = str(self._next_rv())
                    self._store(key, raw)
                    self._emit("MODIFIED", request.resource, raw)
                return raw
            await self._remove(key, raw)
        return raw

    async def _remove(self, key: tuple[Any, str | None, str], raw: dict[str, Any]) -> None:
        """Remove an object for good, then its dependents (the garbage collector's job)."""
        raw["metadata"]["resourceVersion"] = str(self._next_rv())
        self.objects[key].delete()  # type: ignore[index]
        self._emit("DELETED", key[0], raw)
        uid = raw["metadata"].get("uid")
        dependents = [
            (dep_key, obj)
            for dep_key, obj in self.objects.items()
            if not obj.deleted
            and any(ref.get("uid") == uid for ref in (obj.last.raw.get("metadata") or {}).get("ownerReferences") or [])
        ]
        for dep_key, obj in dependents:
            dependent = dict(obj.last.raw)
            if (dependent.get("metadata") or {}).get("finalizers"):
                dependent = merge_patch(dependent, {"metadata": deletion_marks(dep_key[0], dependent, None)})
                dependent["metadata"]["resourceVersion"] = str(self._next_rv())
                self._store(dep_key, dependent)
                self._emit("MODIFIED", dep_key[0], dependent)
            else:
                await self._remove(dep_key, dependent)

    # --- Reads -------------------------------------------------------------------------------------

    def _matching(self, request: Request) -> list[dict[str, Any]]:
        selector = request.params.get("labelSelector", "")
        items = []
        for (resource, namespace, _), obj in self.objects.items():
            if resource != request.resource or obj.deleted:
                continue
            if request.namespace is not None and namespace != request.namespace:
                continue
            raw = obj.last.raw
            if selector_matches(selector, (raw.get("metadata") or {}).get("labels") or {}):
                items.append(raw)
        return items

    async def _serve_list(self, request: Request) -> Payload:
        kind, api_version = self._kinds.get(request.resource, ("Unknown", ""))
        async with self._lock:
            items = self._matching(request)
            rv = str(self._rv)
        return {"apiVersion": api_version, "kind": f"{kind}List", "metadata": {"resourceVersion": rv}, "items": items}
