"""A create that the API server refuses: what the job's status, its Events and the retry say.

A pod (or Service, PodGroup, NetworkPolicy, engine Job) create answered with a 4xx other than 409
is a fact about the cluster that the user must hear about, in the API server's own words:
Pod Security admission forbidding hostNetwork or a hostPath volume, a ResourceQuota exceeded,
a missing service account, an invalid field. Pure: the controller hands in what it got and
carries out the decision (a condition, a Warning Event, a requeue, or a failed job).

- A quota refusal clears by itself when other pods finish: retried with backoff, and said so.
- Pod Security, a missing service account, RBAC: they need someone to act; retried with the
  same backoff (so that the job starts once they have), the condition says what to change.
- A PodGroup's API that the cluster does not serve (404: Kubernetes' own before 1.36 or without its
  feature gates, Volcano or scheduler-plugins not installed): retried with the same backoff, and the
  condition says what the cluster needs or which other provider to choose. No worker pod is created
  before its PodGroup: an API server without Kubernetes' gang API would drop spec.schedulingGroup
  from them, and they would be placed one by one.
- An invalid object (422) is a bug in what was asked for (e.g. requests above limits): retrying
  cannot help, so the job fails with the object's own reason (InvalidPod, InvalidService, ...).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

from dtrain_operator.api import Condition, DistributedTrainingStatus
from dtrain_operator.api.reasons import condition_type, reason
from dtrain_operator.core.status.conditions import FAILED, REASON_JOB_FINISHED, RESTARTING, RUNNING

CREATE_REFUSED = condition_type(
    "CreateRefused", "the API server refused to create one of the job's objects; the message quotes it and says "
    "what to change; dtrain retries with a backoff (an invalid object fails the job instead)",
    "act on the message: its reason names the cause",
)
# Each reason of a refused create is also the reason of the Warning Event that quotes the API server.
REASON_QUOTA = reason("QuotaExceeded", "the namespace's ResourceQuota has no room for the object (CreateRefused); "
                      "retried until it has", "wait for other pods to finish, or raise the quota", event="Warning")
REASON_POD_SECURITY = reason(
    "PodSecurityForbidden", "the namespace's Pod Security level forbids the pod (CreateRefused; retried)",
    "set spec.hostNetwork false and drop hostPath volumes, or have the namespace's level changed", event="Warning",
)
REASON_SERVICE_ACCOUNT = reason(
    "ServiceAccountMissing", "spec.serviceAccountName names no service account (CreateRefused; retried)",
    "create it (the chart's trainer.serviceAccount), or name one that exists", event="Warning",
)
REASON_FORBIDDEN = reason("CreateForbidden", "the operator's service account may not create the object "
                          "(CreateRefused; retried)", "check the operator's RBAC (the chart's ClusterRole)",
                          event="Warning")
REASON_REFUSED = reason("CreateRefused", "the API server refused the object for another reason (CreateRefused; "
                        "retried)", "act on the API server's message", event="Warning")
REASON_GANG_UNAVAILABLE = reason(
    "GangSchedulingUnavailable", "the cluster does not serve the PodGroup API of scheduling.gang.provider; no "
    "worker pod is created before its PodGroup (CreateRefused; retried)",
    "install what the provider needs, or choose another provider", event="Warning",
)
# An invalid object (422): Invalid followed by its kind (InvalidPod, InvalidService, ...).
REASON_INVALID = reason(
    "Invalid<Kind>", "the API server found an object the job asks for invalid, e.g. requests above limits "
    "(InvalidPod, InvalidJob, ...; CreateRefused and Failed)", "fix the spec and create the job again", event="Warning",
)
REASON_CREATED = reason("ChildrenCreated", "every create went through after a refusal (CreateRefused False)")
FIRST_RETRY_SECONDS = 5.0
MAX_RETRY_SECONDS = 300.0
BACKOFF = f"dtrain retries with a backoff from {FIRST_RETRY_SECONDS:.0f} s, doubling up to {MAX_RETRY_SECONDS / 60:.0f} min"
MAX_MESSAGE_CHARS = 2048
UNSERVED = "the server could not find the requested resource"
# What a cluster needs to serve each PodGroup API (by apiVersion), or the other choice.
GANG_SCHEDULING_NEEDS = {
    "scheduling.k8s.io/v1alpha2": "Kubernetes 1.36+ with the feature gates GenericWorkload and GangScheduling and "
    "--runtime-config=scheduling.k8s.io/v1alpha2=true, or set spec.scheduling.gang.provider to volcano or "
    "scheduler-plugins",
    "scheduling.volcano.sh/v1beta1": "Volcano installed, or set spec.scheduling.gang.provider to kubernetes or "
    "scheduler-plugins",
    "scheduling.x-k8s.io/v1alpha1": "scheduler-plugins' PodGroup CRD and its coscheduling scheduler installed, or set "
    "spec.scheduling.gang.provider to kubernetes or volcano",
}


@dataclasses.dataclass(frozen=True)
class Refusal:
    """What to do about one refused create."""

    kind: str
    name: str
    status: int
    reason: str  # the condition's (or, when fails_job, the Failed condition's) reason
    api_message: str  # the API server's own message
    hint: str
    fails_job: bool

    @property
    def message(self) -> str:
        text = f"the API server refused to create {self.kind} {self.name} ({self.status}): {self.api_message}. {self.hint}"
        return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


class CreateRefused(Exception):
    """Raised by the controller's create call when `classify` says the refusal is the user's to hear."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def classify(kind: str, name: str, status: int, message: str, api_version: str = "") -> Refusal | None:
    """The decision for a create of a `kind` object (of `api_version`) answered with `status`; None when it
    is not a refusal to report (a 409 is read back, a 5xx or a lost connection is retried as any failed reconcile)."""
    if not 400 <= status < 500 or status in (409, 429):
        return None
    lowered = message.lower()
    # The API server's words for an API it does not serve (an object's own 404 names the object: the
    # read-back after a 409 of one deleted in between is no statement about the cluster).
    if status == 404 and api_version in GANG_SCHEDULING_NEEDS and UNSERVED in lowered:
        return Refusal(kind, name, status, REASON_GANG_UNAVAILABLE, message,
                       f"This cluster does not serve {api_version} PodGroups: {GANG_SCHEDULING_NEEDS[api_version]}; "
                       + BACKOFF, False)
    if status == 422:
        return Refusal(kind, name, status, REASON_INVALID.replace("<Kind>", kind), message,
                       "The object the job asks for is invalid: fix the spec and re-create the job", True)
    if "exceeded quota" in lowered:
        return Refusal(kind, name, status, REASON_QUOTA, message,
                       f"The namespace's ResourceQuota is used up: the job waits until it has room; {BACKOFF}", False)
    if "podsecurity" in lowered:
        return Refusal(kind, name, status, REASON_POD_SECURITY, message,
                       "The namespace's Pod Security level forbids this pod: set spec.hostNetwork false and drop hostPath "
                       "volumes, or label the namespace pod-security.kubernetes.io/enforce=privileged; " + BACKOFF, False)
    if "not found" in lowered and ("service account" in lowered or 'serviceaccount "' in lowered):
        return Refusal(kind, name, status, REASON_SERVICE_ACCOUNT, message,
                       "Create the service account named in spec.serviceAccountName (the chart's trainer.serviceAccount); "
                       + BACKOFF, False)
    if status == 403:
        return Refusal(kind, name, status, REASON_FORBIDDEN, message,
                       "The operator's service account may not do this: check its RBAC (the chart's ClusterRole); " + BACKOFF,
                       False)
    return Refusal(kind, name, status, REASON_REFUSED, message, BACKOFF, False)


def retry_after(status: DistributedTrainingStatus, now: datetime) -> float:
    """Backoff from the status alone: as long again as the refusal has lasted, from 5 s to 5 min."""
    condition = _get(status, CREATE_REFUSED)
    since = _parse(condition.last_transition_time) if condition is not None else None
    lasted = (now - since).total_seconds() if since is not None else 0.0
    return min(max(lasted, FIRST_RETRY_SECONDS), MAX_RETRY_SECONDS)


def refused_status(status: DistributedTrainingStatus, refusal: Refusal, now: datetime) -> DistributedTrainingStatus:
    """The status with the refusal in it: the CreateRefused condition; for an invalid object, Failed."""
    new = status.model_copy(deep=True)
    _set(new, CREATE_REFUSED, True, refusal.reason, refusal.message, now)
    if refusal.fails_job:
        new.phase = "Failed"
        _set(new, FAILED, True, refusal.reason, refusal.message, now)
        for type_ in (RUNNING, RESTARTING):
            if _get(new, type_) is not None:
                _set(new, type_, False, REASON_JOB_FINISHED, "the job failed", now)
        new.completion_time = _format(now)
    return new


def is_refused(status: DistributedTrainingStatus) -> bool:
    condition = _get(status, CREATE_REFUSED)
    return condition is not None and condition.status == "True"


def cleared_status(status: DistributedTrainingStatus, now: datetime) -> DistributedTrainingStatus:
    """The status once every create went through."""
    new = status.model_copy(deep=True)
    _set(new, CREATE_REFUSED, False, REASON_CREATED, "the API server accepted the job's objects", now)
    return new


def _get(status: DistributedTrainingStatus, type_: str) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def _set(status: DistributedTrainingStatus, type_: str, value: bool, reason: str, message: str, now: datetime) -> None:
    text = "True" if value else "False"
    condition = _get(status, type_)
    if condition is None:
        status.conditions.append(
            Condition(type=type_, status=text, reason=reason, message=message, last_transition_time=_format(now))
        )
        return
    if condition.status != text:
        condition.last_transition_time = _format(now)
    condition.status, condition.reason, condition.message = text, reason, message  # type: ignore[assignment]


def _format(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
