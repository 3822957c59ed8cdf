"""Which spec a job runs: the spec accepted at its creation, with today's values of the fields that may
change. The one place that decides it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from pydantic import ValidationError

from dtrain_operator.api import (
    DistributedTraining,
    DistributedTrainingSpec,
    DistributedTrainingStatus,
    EnvVar,
    immutable_spec,
    with_env_values,
)
from dtrain_operator.api.validation import validate_object

# Fields that may change while the job is suspended: its scheduling directives.
MUTABLE_WHEN_SUSPENDED = ("spec.scheduling.",)


def accepted_job(job: DistributedTraining) -> DistributedTraining:
    """The job as the operator runs it: the spec accepted at creation, with today's mutable fields.

    Before the first status is written (or when the recorded spec no longer validates, e.g.
    after an operator upgrade tightened a rule), that is the object's own spec.
    """
    accepted = job.status.accepted_spec if job.status else None
    if not accepted:
        return job
    run_policy = dict(accepted.get("runPolicy") or {})
    run_policy["suspend"] = job.spec.run_policy.suspend
    run_policy["ttlSecondsAfterFinished"] = job.spec.run_policy.ttl_seconds_after_finished
    try:
        spec = DistributedTrainingSpec.model_validate({**accepted, "runPolicy": run_policy})
    except ValidationError:
        return job
    return job.model_copy(update={"spec": with_env_values(spec, job.spec.env)})


def _changed_paths(old: Any, new: Any, prefix: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        paths: list[str] = []
        for key in sorted(set(old) | set(new)):
            paths.extend(_changed_paths(old.get(key), new.get(key), f"{prefix}.{key}"))
        return paths
    return [] if old == new else [prefix]


def changed_immutable_fields(job: DistributedTraining) -> list[str]:
    """Spec fields (dotted paths) that differ from the spec the job was created with."""
    running = accepted_job(job)
    if running is job:
        return []
    return _changed_paths(immutable_spec(running.spec), immutable_spec(job.spec), "spec")


@dataclass(frozen=True)
class ParsedJob:
    """A DistributedTraining as the operator can run it, or why it cannot."""

    job: Optional[DistributedTraining]
    errors: tuple[str, ...] = ()
    """Validation errors: of the whole object when `job` is None, else of an edit to an accepted job."""


def _readable_env(body: Mapping[str, Any]) -> list[EnvVar]:
    """The env variables of an object whose spec does not validate as a whole, those that do."""
    readable = []
    for var in (body.get("spec") or {}).get("env") or []:
        try:
            readable.append(EnvVar.model_validate(var))
        except ValidationError:
            continue
    return readable


def parse_job(body: Mapping[str, Any], previous: DistributedTrainingStatus) -> ParsedJob:
    """Validate the object (not its status). An accepted job whose spec became invalid keeps its accepted spec."""
    document = {k: v for k, v in body.items() if k != "status"}
    result = validate_object(document, "")
    if result.job is not None:
        return ParsedJob(result.job.model_copy(update={"status": previous}))
    if previous.accepted_spec is None:
        return ParsedJob(None, tuple(result.errors))
    run_policy = dict(previous.accepted_spec.get("runPolicy") or {})
    raw_policy = ((body.get("spec") or {}).get("runPolicy")) or {}
    if isinstance(raw_policy.get("suspend"), bool):
        run_policy["suspend"] = raw_policy["suspend"]
    try:
        spec = DistributedTrainingSpec.model_validate({**previous.accepted_spec, "runPolicy": run_policy})
        spec = with_env_values(spec, _readable_env(body))
        job = DistributedTraining.model_validate(
            {"metadata": body.get("metadata") or {}, "spec": spec.to_wire()}
        ).model_copy(update={"status": previous})
    except ValidationError:
        return ParsedJob(None, tuple(result.errors))
    return ParsedJob(job, tuple(result.errors))
