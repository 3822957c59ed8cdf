"""Which spec a job runs: the spec accepted at its creation, with today's values of the fields that may
change. The one place that decides it, for the reconciler (`parse_job`) and the status (`accepted_job`,
`changed_immutable_fields`); which fields may change is the API's (api.MUTABLE_RUN_POLICY_FIELDS, also
enforced by the CRD's rules), and what the accepted copy records is api.immutable_spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from dtrain_operator.api import (
    MUTABLE_RUN_POLICY_FIELDS,
    DistributedTraining,
    DistributedTrainingSpec,
    DistributedTrainingStatus,
    EnvVar,
    immutable_spec,
    with_env_values,
)
from dtrain_operator.api.job_defaults import WHOLE_FIELDS, with_defaults
from dtrain_operator.api.validation import validate_object

# Fields that may change while the job is suspended: its scheduling directives.
MUTABLE_WHEN_SUSPENDED = ("spec.scheduling.",)


def running_spec(
    accepted: Mapping[str, Any], run_policy: Mapping[str, Any], env: list[EnvVar]
) -> DistributedTrainingSpec | None:
    """The accepted spec with the mutable runPolicy fields taken from `run_policy` (wire names) and the
    env values from `env`; None when the recorded spec no longer validates (e.g. after an operator
    upgrade tightened a rule)."""
    mutable = {key: value for key, value in run_policy.items() if key in MUTABLE_RUN_POLICY_FIELDS}
    try:
        spec = DistributedTrainingSpec.model_validate(
            {**accepted, "runPolicy": {**(accepted.get("runPolicy") or {}), **mutable}}
        )
    except ValidationError:
        return None
    return with_env_values(spec, env)


def accepted_job(job: DistributedTraining) -> DistributedTraining:
    """The job as the operator runs it: the spec accepted at creation, with today's mutable fields.

    Before the first status is written (or when the recorded spec no longer validates), that is
    the object's own spec.
    """
    accepted = job.status.accepted_spec if job.status else None
    if not accepted:
        return job
    spec = running_spec(accepted, job.spec.run_policy.model_dump(by_alias=True, mode="json"), job.spec.env)
    return job if spec is None else job.model_copy(update={"spec": spec})


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

    job: DistributedTraining | None
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


def filled_spec(body: Mapping[str, Any], previous: DistributedTrainingStatus, defaults: Mapping[str, Any]) -> Any:
    """The object's spec with what it leaves unset taken from the job defaults (api.job_defaults); once the job
    is accepted, from the spec it was accepted with, so that defaults changed since are no edit of the job."""
    spec = body.get("spec")
    if not isinstance(spec, Mapping):
        return spec
    if previous.accepted_spec is not None:
        defaults = _as_accepted(defaults, previous.accepted_spec)
    return with_defaults(spec, defaults)


def _as_accepted(defaults: Mapping[str, Any], accepted: Mapping[str, Any]) -> dict[str, Any]:
    """The fields the defaults set, with the values the job was accepted with (a field the defaults do not set
    stays the job's own: removing it is an edit, as it always was)."""
    taken: dict[str, Any] = {}
    for key, default in defaults.items():
        if key not in accepted or key == "env":
            continue
        value = accepted[key]
        both_objects = isinstance(default, Mapping) and isinstance(value, Mapping)
        taken[key] = _as_accepted(default, value) if both_objects and key not in WHOLE_FIELDS else value
    return taken


def parse_job(body: Mapping[str, Any], previous: DistributedTrainingStatus, defaults: Mapping[str, Any]) -> ParsedJob:
    """Validate the object (not its status), its unset fields filled (`filled_spec`). An accepted job whose spec
    became invalid keeps its accepted spec."""
    document = {k: v for k, v in body.items() if k != "status"}
    if "spec" in document:
        document["spec"] = filled_spec(body, previous, defaults)
    result = validate_object(document, "")
    if result.job is not None:
        return ParsedJob(result.job.model_copy(update={"status": previous}))
    if previous.accepted_spec is None:
        return ParsedJob(None, tuple(result.errors))
    # Of an edit that does not validate, only a well-formed suspend is taken: it stops the job.
    raw_policy = ((body.get("spec") or {}).get("runPolicy")) or {}
    suspend = {"suspend": raw_policy["suspend"]} if isinstance(raw_policy.get("suspend"), bool) else {}
    spec = running_spec(previous.accepted_spec, suspend, _readable_env(body))
    if spec is None:
        return ParsedJob(None, tuple(result.errors))
    try:
        job = DistributedTraining.model_validate({"metadata": body.get("metadata") or {}, "spec": spec.to_wire()})
    except ValidationError:
        return ParsedJob(None, tuple(result.errors))
    return ParsedJob(job.model_copy(update={"status": previous}), tuple(result.errors))
