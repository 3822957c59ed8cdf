"""The refusals of a pod (or Service, ConfigMap, PodGroup, Job) create that a real cluster's
admission makes and the test API server does not: Pod Security admission, a ResourceQuota, a
missing service account, an invalid field, an API not served, each with the API server's own message, for the tests
of how the operator reports them (test_refusals.py): what they test is the operator's reaction.

apiserver.ApiServer calls every hook in its `admission` list on create and update
(`hook(request, new, old)` returns the object to store, or raises KubernetesError).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .kmock_adapter import KubernetesError, is_dry_run


@dataclasses.dataclass
class Refusal:
    matches: Callable[[Any, dict[str, Any]], bool]
    status: int
    reason: str
    message: Callable[[dict[str, Any]], str]
    times: int | None = None
    on_dry_run: bool = True  # False: dry runs pass (as through a webhook that does not take part in them)


class Refusals:
    """Creates that a real API server refuses, each with its own words (ApiServer.admission hook)."""

    def __init__(self) -> None:
        self.refusals: list[Refusal] = []
        self.refused = 0

    def _add(self, refusal: Refusal) -> Refusal:
        self.refusals.append(refusal)
        return refusal

    @staticmethod
    def _kind_is(plural: str) -> Callable[[Any, dict[str, Any]], bool]:
        return lambda request, obj: request.resource.plural == plural

    def pod_security(self, level: str = "baseline") -> Refusal:
        """Pod Security admission enforcing `level` in the namespace: hostNetwork and hostPath forbidden."""

        def violations(obj: dict[str, Any]) -> list[str]:
            spec = obj.get("spec") or {}
            found = []
            if spec.get("hostNetwork"):
                found.append("host namespaces (hostNetwork=true)")
            host_paths = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
            if host_paths:
                names = ", ".join(f'"{n}"' for n in host_paths)
                found.append(f"hostPath volumes (volume{'s' if len(host_paths) > 1 else ''} {names})")
            return found

        return self._add(Refusal(
            lambda request, obj: request.resource.plural == "pods" and bool(violations(obj)),
            403, "Forbidden",
            lambda obj: f'pods "{obj["metadata"]["name"]}" is forbidden: violates PodSecurity "{level}:latest": '
            + ", ".join(violations(obj)),
        ))

    def quota(self, resource: str = "requests.nvidia.com/gpu", limit: str = "4", times: int | None = None) -> Refusal:
        """A ResourceQuota exceeded (for `times` creates, or until removed)."""
        return self._add(Refusal(
            self._kind_is("pods"), 403, "Forbidden",
            lambda obj: f'pods "{obj["metadata"]["name"]}" is forbidden: exceeded quota: team-quota, '
            f"requested: {resource}=8, used: {resource}={limit}, limited: {resource}={limit}",
            times,
        ))

    def missing_service_account(self) -> Refusal:
        """The ServiceAccount admission plugin: the pod's service account does not exist."""

        def message(obj: dict[str, Any]) -> str:
            account = (obj.get("spec") or {}).get("serviceAccountName", "default")
            namespace = obj["metadata"].get("namespace", "default")
            return (f'pods "{obj["metadata"]["name"]}" is forbidden: error looking up service account '
                    f'{namespace}/{account}: serviceaccount "{account}" not found')

        return self._add(Refusal(self._kind_is("pods"), 403, "Forbidden", message))

    def invalid(self, plural: str = "pods", field: str = "spec.containers[0].resources.requests",
                detail: str = 'Invalid value: "64": must be less than or equal to cpu limit of 8',
                on_dry_run: bool = True) -> Refusal:
        """Validation of a built-in kind: 422 Invalid (`on_dry_run` False: only the real create is refused)."""
        kinds = {"pods": "Pod", "services": "Service", "configmaps": "ConfigMap", "jobs": "Job.batch",
                 "podgroups": "PodGroup.scheduling.volcano.sh"}
        return self._add(Refusal(
            self._kind_is(plural), 422, "Invalid",
            lambda obj: f'{kinds.get(plural, plural)} "{obj["metadata"]["name"]}" is invalid: {field}: {detail}',
            on_dry_run=on_dry_run,
        ))

    def not_served(self, api_version: str, plural: str) -> Refusal:
        """An API the cluster does not serve (an alpha API left off, a CRD not installed): 404 NotFound in the
        API server's words for any path it has no handler for. kmock stores any resource it is sent."""
        group, version = api_version.split("/")
        return self._add(Refusal(
            lambda request, obj: (request.resource.group, request.resource.version, request.resource.plural)
            == (group, version, plural),
            404, "NotFound", lambda obj: "the server could not find the requested resource",
        ))

    def remove(self, refusal: Refusal) -> None:
        self.refusals.remove(refusal)

    def clear(self) -> None:
        self.refusals.clear()

    def hook(self, request: Any, new: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        if old is not None:
            return new
        for refusal in list(self.refusals):
            if refusal.times == 0:
                self.refusals.remove(refusal)
                continue
            if refusal.matches(request, new) and (refusal.on_dry_run or not is_dry_run(request)):
                if is_dry_run(request):  # refused as the create would be, but a dry run uses up none of `times`
                    raise KubernetesError(refusal.status, refusal.reason, refusal.message(new))
                if refusal.times is not None:
                    refusal.times -= 1
                self.refused += 1
                raise KubernetesError(refusal.status, refusal.reason, refusal.message(new))
        return new
