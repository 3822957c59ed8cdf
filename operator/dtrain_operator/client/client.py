"""The Client: jobs on a cluster through the Kubernetes API (the package docstring shows its use)."""

# layout: the Client's public methods are the client's API, one class (a little over 400 lines); its errors,
# progress and credentials are modules of their own.

from __future__ import annotations

import builtins
import json
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtrain_operator import api
from dtrain_operator.api import contract
from dtrain_operator.api.validation import DocumentResult, validate_file, validate_object
from dtrain_operator.client.credentials import load_configuration
from dtrain_operator.client.errors import (
    AlreadyExists,
    ApiRequestError,
    ConnectionFailed,
    DtrainError,
    InvalidJob,
    NoCrdError,
    NotFound,
    PermissionDenied,
    WaitTimeout,
)
from dtrain_operator.client.progress_updates import ProgressUpdate

if TYPE_CHECKING:
    from typing_extensions import Self

JobSource = str | Path | Mapping[str, Any] | api.DistributedTraining

DEFAULT_REQUEST_TIMEOUT_SECONDS = 30.0
DEFAULT_POLL_SECONDS = 2.0
USER_AGENT = "dtrain-client/0.1.0"
TRAINER_CONTAINER = "trainer"
CRD_NAME = f"{contract.PLURAL}.{contract.GROUP}"
INSTALL_HINT = (
    "install the operator (helm install dtrain helm/dtrain-operator -n dtrain-system --create-namespace, "
    "or kubectl apply -k manifests/), or pick the cluster that has it with --context"
)
# dtrain is not published to PyPI, where `pip install 'dtrain[client]'` would look for it: it installs
# from a checkout of its repository or from a wheel built there.
INSTALL_CLIENT = "pip install './[client]' in a checkout of dtrain, or its wheel with [client] (see docs/cluster.md)"
UPGRADE_CLIENT = "pip install -U './[client]' in a newer checkout, or its wheel with [client]"


def _worker_rank(pod: Mapping[str, Any]) -> int | None:
    rank = ((pod.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_NODE_RANK)
    return int(rank) if isinstance(rank, str) and rank.isdigit() else None


def _generation(pod: Mapping[str, Any]) -> int:
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_GANG_GENERATION, "0")
    return int(value) if str(value).isdigit() else 0


class Client:
    """DistributedTrainings on one cluster: submit, get, list, wait, progress, logs, delete.

    Args:
        namespace: default namespace of every call (else the kubeconfig context's, the pod's, or default).
        context: kubeconfig context to use (else the current context).
        kubeconfig: path of the kubeconfig (else $KUBECONFIG, ~/.kube/config, or in-cluster credentials).
        request_timeout: seconds each request may take.
    """

    def __init__(
        self,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | Path | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        try:
            from kubernetes import client
        except ImportError as exc:
            raise DtrainError(f"the dtrain client needs the kubernetes package: {INSTALL_CLIENT}") from exc
        configuration, credential_namespace, self.credentials = load_configuration(
            str(kubeconfig) if kubeconfig else None, context
        )
        self.namespace = namespace or credential_namespace or "default"
        self._explicit_namespace = namespace is not None
        self.request_timeout = request_timeout
        self._api = client.ApiClient(configuration)
        self._api.user_agent = USER_AGENT
        self._served: bool | None = None

    def close(self) -> None:
        """Close the connections to the API server (a `with Client() as dtr:` block does it on leaving)."""
        self._api.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- HTTP -----------------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        """The raw response (kubernetes.client.rest.RESTResponse), whatever its status."""
        import urllib3

        query_params = [(k, v) for k, v in (query or {}).items() if v is not None]
        method_, url, headers, body_, _ = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query_params or None,
            header_params={"Content-Type": content_type, "Accept": "application/json, */*"},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            return self._api.call_api(
                method_, url, header_params=headers, body=body_,
                _request_timeout=timeout if timeout is not None else self.request_timeout,
            )
        except urllib3.exceptions.HTTPError as exc:
            host = self._api.configuration.host
            raise ConnectionFailed(
                f"no answer from the API server at {host} ({type(exc).__name__}); check that the cluster is up "
                f"and that your kubeconfig points at it ({self.credentials})"
            ) from exc

    def _json(self, method: str, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        status, decoded, data = self._decoded(self._send(method, path, **kwargs))
        if 200 <= status < 300:
            return decoded
        raise self._error(status, decoded, data, method, path, what)

    @staticmethod
    def _decoded(response: Any) -> tuple[int, dict[str, Any], bytes]:
        """A response's status, its JSON object (empty when the body is none), and its raw body."""
        data = response.read()
        try:
            decoded = json.loads(data) if data else {}
        except ValueError:
            decoded = {}
        return response.status, decoded if isinstance(decoded, dict) else {}, data

    @staticmethod
    def _message(decoded: Mapping[str, Any], data: bytes) -> str:
        """The server's message, or the start of its body."""
        return str(decoded.get("message") or (data or b"")[:300].decode(errors="replace")).strip()

    def _error(self, status: int, decoded: Mapping[str, Any], data: bytes, method: str, path: str, what: str) -> DtrainError:
        reason = str(decoded.get("reason") or "")
        message = self._message(decoded, data)
        verb = {"POST": "create", "GET": "get", "DELETE": "delete", "PATCH": "patch"}.get(method, method.lower())
        namespace = self._namespace_of(path)
        if status in (401, 403):
            resource = "pods/log" if path.endswith("/log") else ("pods" if "/pods" in path else contract.PLURAL)
            can_i = f"kubectl auth can-i {verb} {resource}" + (f" -n {namespace}" if namespace else "")
            who = "you are not logged in (401)" if status == 401 else "permission denied (403)"
            return PermissionDenied(
                f"{who}: cannot {verb} {resource}" + (f" in namespace {namespace}" if namespace else "")
                + f" ({message}). Check with `{can_i}`; ask your cluster admin for a Role that allows it"
                + " (the chart's trainer and operator roles are not meant for people)"
            )
        if status == 404:
            if not self._crd_served(refresh=True):
                return NoCrdError(f"this cluster does not serve {contract.API_VERSION} (the CRD {CRD_NAME} is "
                                  f"not installed): {INSTALL_HINT}")
            return NotFound(f"{what} not found" + (f" in namespace {namespace}" if namespace else "")
                            + "; `dtrain get` lists the jobs there (-n NAMESPACE for another namespace)")
        if status == 409 and method == "POST":
            return AlreadyExists(f"{what} already exists" + (f" in namespace {namespace}" if namespace else "")
                                 + "; delete it first (dtrain delete NAME) or choose another metadata.name")
        if status == 422 or status == 400:
            return InvalidJob([f"the API server refused {what}: {message}"])
        return ApiRequestError(status, reason, message)

    @staticmethod
    def _namespace_of(path: str) -> str | None:
        parts = path.split("/")
        return parts[parts.index("namespaces") + 1] if "namespaces" in parts[:-1] else None

    def _crd_served(self, refresh: bool = False) -> bool:
        if self._served is None or refresh:
            response = self._send("GET", f"/apis/{contract.API_VERSION}")
            response.read()
            if response.status in (401, 403):
                return True  # discovery refused: let the request's own error speak
            served = False
            if response.status == 200:
                try:
                    resources = json.loads(response.data).get("resources") or []
                except (ValueError, AttributeError):
                    resources = []
                served = not resources or any(r.get("name") == contract.PLURAL for r in resources)
            self._served = served
        return self._served

    def check_installed(self) -> None:
        """Raise NoCrdError unless the cluster serves DistributedTrainings."""
        if not self._crd_served(refresh=True):
            raise NoCrdError(f"this cluster does not serve {contract.API_VERSION} (the CRD {CRD_NAME} is not "
                             f"installed): {INSTALL_HINT}")

    def _jobs_path(self, namespace: str | None, name: str = "") -> str:
        prefix = f"/apis/{contract.API_VERSION}"
        path = f"{prefix}/namespaces/{namespace}/{contract.PLURAL}" if namespace else f"{prefix}/{contract.PLURAL}"
        return f"{path}/{urllib.parse.quote(name)}" if name else path

    # --- Jobs -----------------------------------------------------------------------------------

    @staticmethod
    def validate(job: JobSource) -> api.DistributedTraining:
        """The job as the API model, or InvalidJob with the lines `dtrain validate` prints."""
        return Client._checked(job).job  # type: ignore[return-value]

    @staticmethod
    def _checked(job: JobSource) -> DocumentResult:
        """The job checked as `dtrain validate` checks a file, with the object to send as it was given."""
        if isinstance(job, api.DistributedTraining):
            wire = job.model_dump(by_alias=True, exclude_none=True, exclude_unset=True, mode="json")
            wire.setdefault("apiVersion", contract.API_VERSION)
            wire.setdefault("kind", contract.KIND)
            result = validate_object(wire, "job")
        elif isinstance(job, Mapping):
            # A plain, deep copy: JSON is what the API server takes.
            result = validate_object(json.loads(json.dumps(dict(job))), "job")
        else:
            result = validate_file(job)
        if result.errors:
            raise InvalidJob([f"{result.source}: {error}" for error in result.errors])
        return result

    def submit(
        self, job: JobSource, namespace: str | None = None, annotations: Mapping[str, str] | None = None
    ) -> api.DistributedTraining:
        """Validate the job (a file, a dict or the model) and create it, with `annotations` added to
        its own; returns the created job."""
        result = self._checked(job)
        model, raw = result.job, result.document
        assert model is not None
        raw.pop("status", None)
        meta = raw.setdefault("metadata", {})
        if annotations:
            meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
        wanted = namespace or (self.namespace if self._explicit_namespace else None)
        if meta.get("namespace") and wanted and meta["namespace"] != wanted:
            raise DtrainError(
                f"the job names namespace {meta['namespace']!r} but {wanted!r} was asked for; "
                f"use -n {meta['namespace']} or remove metadata.namespace from the file"
            )
        target = meta.get("namespace") or wanted or self.namespace
        meta["namespace"] = target
        if not self._crd_served():
            self.check_installed()
        created = self._json("POST", self._jobs_path(target), f"DistributedTraining {model.name}", body=raw)
        return self._model(created)

    def dry_run(self, obj: Mapping[str, Any]) -> tuple[int, str]:
        """The API server's answer to creating `obj` (in its metadata.namespace) as a server-side dry run:
        admitted and validated, never stored (contract.dry_run_query).
        Returns the HTTP status and the server's message."""
        meta = obj["metadata"]
        prefix, plural = contract.RESOURCES[(obj["apiVersion"], obj["kind"])]
        status, decoded, data = self._decoded(self._send(
            "POST", f"{prefix}/namespaces/{meta['namespace']}/{plural}", query=contract.dry_run_query(obj["kind"]), body=dict(obj)
        ))
        return status, self._message(decoded, data)

    def get(self, name: str, namespace: str | None = None) -> api.DistributedTraining:
        """The job as the API model, status included; NotFound when there is none."""
        ns = namespace or self.namespace
        return self._model(self._json("GET", self._jobs_path(ns, name), f"DistributedTraining {name}"))

    def list(self, namespace: str | None = None, all_namespaces: bool = False) -> list[api.DistributedTraining]:
        """The jobs of a namespace (or of every namespace), oldest first."""
        path = self._jobs_path(None if all_namespaces else namespace or self.namespace)
        items = self._json("GET", path, "DistributedTrainings").get("items") or []
        if not self._crd_served() and not items:
            self.check_installed()
        jobs = [self._model(item) for item in items if isinstance(item, dict)]
        return sorted(jobs, key=lambda j: ((j.metadata.model_extra or {}).get("creationTimestamp") or "", j.name))

    def delete(self, name: str, namespace: str | None = None, wait: bool = False, timeout: float = 60.0) -> None:
        """Delete a job (its pods, Service and engine Job go with it); `wait` until it is gone."""
        ns = namespace or self.namespace
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        self._json("DELETE", self._jobs_path(ns, name), f"DistributedTraining {name}", body=options)
        deadline = time.monotonic() + timeout
        while wait:
            try:
                self.get(name, ns)
            except NotFound:
                return
            if time.monotonic() > deadline:
                raise WaitTimeout(f"{ns}/{name} still exists {timeout:g} s after its deletion (finalizers?)", None)
            time.sleep(0.5)

    @staticmethod
    def _model(raw: Mapping[str, Any]) -> api.DistributedTraining:
        from pydantic import ValidationError

        from dtrain_operator.api.validation import format_validation_error

        try:
            return api.DistributedTraining.model_validate(raw)
        except ValidationError as exc:
            name = (raw.get("metadata") or {}).get("name", "?")
            first = format_validation_error(exc)[0]
            raise DtrainError(
                f"the cluster's DistributedTraining {name} does not fit this dtrain's API model ({first}); "
                f"the operator there is probably newer: upgrade dtrain ({UPGRADE_CLIENT})"
            ) from exc

    # --- Waiting and progress ---------------------------------------------------------------------

    def wait(
        self,
        name: str,
        phase: str | Iterable[str] | None = None,
        timeout: float | None = None,
        namespace: str | None = None,
        interval: float = DEFAULT_POLL_SECONDS,
    ) -> api.DistributedTraining:
        """Wait until the job reaches `phase` (one or several; default: Succeeded or Failed) and return it.

        A job that finishes in another phase than the one asked for ends the wait too (it will not
        get there any more): check `job.status.phase`. Raises WaitTimeout after `timeout` seconds.
        """
        wanted = set(api.FINISHED_PHASES) if phase is None else ({phase} if isinstance(phase, str) else set(phase))
        deadline = None if timeout is None else time.monotonic() + timeout
        job: api.DistributedTraining | None = None
        while True:
            job = self.get(name, namespace)
            current = job.status.phase if job.status else None
            if current in wanted or current in api.FINISHED_PHASES:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"{job.namespace}/{name} is {current or 'not started'} after {timeout:g} s, not "
                    f"{' or '.join(sorted(wanted))}; wait longer or look at `dtrain get {name}` and `dtrain logs {name}`",
                    job,
                )
            time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))

    def progress(
        self,
        name: str,
        namespace: str | None = None,
        interval: float = DEFAULT_POLL_SECONDS,
        timeout: float | None = None,
    ) -> Iterator[ProgressUpdate]:
        """Each change of the job's phase or progress, from now until it succeeds or fails (or `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last: tuple[Any, ...] | None = None
        while True:
            update = ProgressUpdate.of(self.get(name, namespace))
            if update.key() != last:
                last = update.key()
                yield update
            if update.finished:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"{name} is still {update.phase or 'starting'} after {timeout:g} s", update.job)
            time.sleep(interval)

    # --- Pods and logs ------------------------------------------------------------------------------

    def worker_pods(self, name: str, namespace: str | None = None) -> builtins.list[dict[str, Any]]:
        """The job's worker pods of its newest gang, by rank (plain dicts as the API server has them)."""
        ns = namespace or self.namespace
        selector = f"{contract.LABEL_JOB_NAME}={name},{contract.LABEL_ROLE}={contract.ROLE_WORKER}"
        items = self._json("GET", f"/api/v1/namespaces/{ns}/pods", f"pods of {name}",
                           query={"labelSelector": selector}).get("items") or []
        pods = [p for p in items if isinstance(p, dict) and _worker_rank(p) is not None]
        newest = max((_generation(p) for p in pods), default=0)
        return sorted((p for p in pods if _generation(p) == newest), key=lambda p: _worker_rank(p) or 0)

    def _pod_of(self, name: str, rank: int, namespace: str) -> str:
        pods = self.worker_pods(name, namespace)
        pod = next((p for p in pods if _worker_rank(p) == rank), None)
        if pod is None:
            self.get(name, namespace)  # NotFound (or NoCrdError) for a job that is not there
            ranks = ", ".join(str(_worker_rank(p)) for p in pods) or "none yet"
            raise NotFound(f"{name} has no worker pod of rank {rank} in namespace {namespace} (ranks: {ranks}); "
                           "pods are created when the job starts and deleted when it finishes (cleanPodPolicy)")
        return str(pod["metadata"]["name"])

    def logs(
        self,
        name: str,
        rank: int = 0,
        namespace: str | None = None,
        tail_lines: int | None = None,
        previous: bool = False,
    ) -> str:
        """The trainer container's log of the worker pod of `rank` (its newest gang)."""
        ns = namespace or self.namespace
        pod = self._pod_of(name, rank, ns)
        response = self._log_request(pod, ns, follow=False, tail_lines=tail_lines, previous=previous)
        return response.read().decode(errors="replace")

    def stream_logs(
        self, name: str, rank: int = 0, namespace: str | None = None, tail_lines: int | None = None
    ) -> Iterator[str]:
        """Follow the log of rank `rank` line by line until the container ends (`kubectl logs -f`)."""
        ns = namespace or self.namespace
        pod = self._pod_of(name, rank, ns)
        response = self._log_request(pod, ns, follow=True, tail_lines=tail_lines, previous=False)
        pending = b""
        try:
            for chunk in response.response.stream(4096, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
            if pending:
                yield pending.decode(errors="replace")
        finally:
            response.response.release_conn()

    def _log_request(self, pod: str, namespace: str, follow: bool, tail_lines: int | None, previous: bool) -> Any:
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/log"
        query = {
            "container": TRAINER_CONTAINER,
            "follow": "true" if follow else None,
            "tailLines": tail_lines,
            "previous": "true" if previous else None,
        }
        # A followed log has no end in sight: no read timeout, only one to connect.
        timeout: Any = (self.request_timeout, None) if follow else self.request_timeout
        response = self._send("GET", path, query=query, timeout=timeout)
        if response.status >= 300:
            data = response.read()
            try:
                decoded = json.loads(data)
            except ValueError:
                decoded = {}
            raise self._error(response.status, decoded if isinstance(decoded, dict) else {}, data, "GET", path,
                              f"the log of pod {pod}")
        return response
