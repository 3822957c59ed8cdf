"""The status a reconcile starts from: the operator's record of the job, read back from the object.

The operator alone writes the status (users are granted `distributedtrainings`, never
`distributedtrainings/status`; rank 0's records reach it through the operator's report endpoint,
report_server.py), so what it decided (the accepted spec, restarts, gang generations, phase, times) is
read back from there, as Kubernetes' own controllers and every anchor do.

`read_status` reads the status field by field, so that a field of the operator's own it cannot read
(`restarts: "three"`, a status written by a newer operator) is named instead of silently replaced. The
trainer's fields (api.record_patches.TRAINER_FIELDS: `progress`, `preflight`, ...) are what a worker
reported: one over its size bound or of the wrong shape is read as absent, never a reason to stop deciding.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from dtrain_operator.api import DistributedTrainingStatus
from dtrain_operator.api.record_patches import MAX_TRAINER_FIELD_BYTES, TRAINER_FIELDS

MAX_PROBLEM_CHARS = 200


@dataclass(frozen=True)
class ReadStatus:
    """The status as far as it could be read, and what could not be read."""

    status: DistributedTrainingStatus
    problems: tuple[str, ...] = field(default_factory=tuple)


def _shorten(text: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(error: ValidationError, prefix: str) -> list[str]:
    problems = []
    for item in error.errors():
        path = ".".join(str(part) for part in (prefix, *item.get("loc", ())) if part != "")
        value = item.get("input")
        shown = "" if isinstance(value, (dict, list)) else f" (got {json.dumps(value, default=str)})"
        problems.append(_shorten(f"{path}: {item.get('msg', 'invalid')}{shown}"))
    return problems


def read_status(body: Mapping[str, Any]) -> ReadStatus:
    """The object's status, one field at a time: the fields that read, and a line for each that does not."""
    raw = body.get("status")
    if raw is None:
        return ReadStatus(DistributedTrainingStatus())
    if not isinstance(raw, dict):
        return ReadStatus(DistributedTrainingStatus(), (f"status is not an object ({type(raw).__name__})",))
    good: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in raw.items():
        trainers = key in TRAINER_FIELDS
        if trainers and value is not None and len(json.dumps(value, default=str).encode()) > MAX_TRAINER_FIELD_BYTES:
            continue  # the trainer's word, over its bound: read as absent, never a reason to stop deciding
        try:
            DistributedTrainingStatus.model_validate({key: value})
        except ValidationError as exc:
            if not trainers:
                problems.extend(_describe(exc, "status"))
            continue
        good[key] = value
    return ReadStatus(DistributedTrainingStatus.model_validate(good), tuple(problems))


def starting_status(read: DistributedTrainingStatus, pod_generations: Sequence[int] = ()) -> DistributedTrainingStatus:
    """The status a reconcile decides from: the status read, once the job is accepted.

    Before (no acceptedSpec) the job starts afresh, from the gang generation of the pods the operator
    created (their labels are the operator's own), except that a job that failed validation keeps its
    failure until its spec is fixed.
    """
    if read.accepted_spec is not None:
        return read
    failed = read.phase == "Failed"
    return DistributedTrainingStatus(
        phase="Failed" if failed else None,
        conditions=read.conditions if failed else [],
        completion_time=read.completion_time if failed else None,
        restarts=max(pod_generations, default=0),
        progress=read.progress,
        last_checkpoint=read.last_checkpoint,
    )
