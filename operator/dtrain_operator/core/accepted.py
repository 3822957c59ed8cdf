"""Which spec a job runs: the spec accepted at its creation, with today's values of the fields that may
change. The one place that decides it.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from dtrain_operator.api import (
    DistributedTraining,
    DistributedTrainingSpec,
    immutable_spec,
    with_env_values,
)

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
