"""What the operator trusts about a job: its own record, kept where only the operator writes it.

`status` is not that place. The operator alone writes it (rank 0's progress reaches it through the
operator's report endpoint, report_server.py), but whoever is granted `distributedtrainings/status`
(an administrator's tool, a backup restored without or with an old status) can still change it,
and the state that decides what the operator creates and how many restarts remain (the accepted
spec, the gang generation, the phase, the start and completion times) must not follow from that.
So it is recorded in one annotation on the DistributedTraining, `dtrain.dev/state`, written with a
patch of the object itself, which a status patch cannot reach (the status subresource keeps
everything but `status`).

Annotations are not the operator's alone: whoever may edit the DistributedTraining may set them
(the chart's ValidatingAdmissionPolicy refuses that on Kubernetes 1.30+, but an operator must not
rest its trust on an admission policy someone may have switched off). So the record is signed: it
carries an HMAC-SHA256, under the operator's own key (record_key.py, a Secret only the operator's
service account reads), of the record and of the job's namespace, name and UID. A record someone
else wrote, edited, copied from another job, or one that this operator cannot read (another
version's, truncated) is not trusted: the operator then leaves the job's pods alone and says so
(see `read_status`), and never creates anything from it. The status the operator writes still
shows the same fields (`acceptedSpec`, `restarts`, ...) for people and tools; it is never read
back for a decision.

`read_status` reads the status field by field, so that a field of the operator's own it cannot read
(`restarts: "three"`, a status written by a newer operator) is named instead of silently replaced. The
trainer's fields (api.records.TRAINER_FIELDS: `progress`, `preflight`, ...) are what a worker reported: one
over its size bound or of the wrong shape is read as absent, never as a reason to stop deciding.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from dtrain_operator.api import DistributedTrainingStatus, ElasticStatus, contract
from dtrain_operator.api.record_patches import MAX_TRAINER_FIELD_BYTES, TRAINER_FIELDS

ANNOTATION = contract.ANNOTATION_STATE
# 2: signed with the operator's key (version 1 carried only a hash, which anyone could compute).
VERSION = 2
MAX_PROBLEM_CHARS = 200


@dataclass(frozen=True)
class TrustedState:
    """The operator's record of one accepted job."""

    accepted_spec: dict[str, Any]
    restarts: int = 0
    evictions: int = 0
    restarts_ignoring_backoff: int = 0
    restarts_in_place: int = 0
    in_place_generation: int | None = None
    """The generation that restarts in place: whether the previous generation's pods are kept (status.inPlaceGeneration)."""
    phase: str | None = None
    start_time: str | None = None
    completion_time: str | None = None
    succeeded_ranks: tuple[int, ...] = ()
    """Ranks of the gang generation (restarts + evictions + restartsIgnoringBackoff) that exited 0: finished, even
    once their pods are gone."""
    gang_nodes: int | None = None
    """An elastic gang's size now (status.elastic.nodes): how many worker pods the operator creates."""
    resizes: int = 0
    capacity_back_step: int | None = None
    """When a smaller elastic gang grows back (status.elastic.capacityBackStep)."""

    @property
    def gang_generation(self) -> int:
        return self.restarts + self.evictions + self.restarts_ignoring_backoff

    def encode(self, key: bytes, job: JobIdentity) -> str:
        record: dict[str, Any] = {
            "version": VERSION,
            "restarts": self.restarts,
            "evictions": self.evictions,
            "restartsIgnoringBackoff": self.restarts_ignoring_backoff,
            "restartsInPlace": self.restarts_in_place,
            "inPlaceGeneration": self.in_place_generation,
            "phase": self.phase,
            "startTime": self.start_time,
            "completionTime": self.completion_time,
            "succeededRanks": list(self.succeeded_ranks),
            "acceptedSpec": self.accepted_spec,
            "gangNodes": self.gang_nodes,
            "resizes": self.resizes,
            "capacityBackStep": self.capacity_back_step,
        }
        record["signature"] = _signature(key, job, record)
        return _canonical(record)


@dataclass(frozen=True)
class JobIdentity:
    """One incarnation of a job: a record signed for it is worthless on any other job, or on a job
    deleted and created again under the same name (a new UID)."""

    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> JobIdentity:
        meta = body.get("metadata") or {}
        return cls(str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""))


def _canonical(record: Mapping[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _signature(key: bytes, job: JobIdentity, record: Mapping[str, Any]) -> str:
    """HMAC-SHA256 of the job's identity and the record (without its signature), hex."""
    unsigned = {k: v for k, v in record.items() if k != "signature"}
    message = json.dumps([job.namespace, job.name, job.uid]) + "\n" + _canonical(unsigned)
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


class UntrustedState(Exception):
    """The annotation is there but is not a record this operator wrote and can read."""


def decode(text: str, key: bytes, job: JobIdentity) -> TrustedState:
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise UntrustedState(f"annotation {ANNOTATION} is not JSON ({exc})") from exc
    if not isinstance(record, dict):
        raise UntrustedState(f"annotation {ANNOTATION} is not a JSON object")
    if record.get("version") != VERSION:
        raise UntrustedState(
            f"annotation {ANNOTATION} has version {record.get('version')!r}; this operator reads version {VERSION} "
            "(was it written by another operator version?)"
        )
    signature = record.get("signature")
    if not isinstance(signature, str) or not hmac.compare_digest(signature, _signature(key, job, record)):
        raise UntrustedState(
            f"annotation {ANNOTATION}: its signature does not verify (not written by this operator for this job, "
            "or under a key it no longer has); nothing is created from it. Delete the job and create it again"
        )
    spec = record.get("acceptedSpec")
    if not isinstance(spec, dict):
        raise UntrustedState(f"annotation {ANNOTATION}: acceptedSpec is not an object")
    # A record written before restartsIgnoringBackoff or restartsInPlace existed has none: 0.
    counts = {
        name: record.get(name, 0)
        for name in ("restarts", "evictions", "restartsIgnoringBackoff", "restartsInPlace", "resizes")
    }
    for name, count in counts.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise UntrustedState(f"annotation {ANNOTATION}: {name} is not a count ({count!r})")
    in_place = record.get("inPlaceGeneration")
    if in_place is not None and (not isinstance(in_place, int) or isinstance(in_place, bool) or in_place < 1):
        raise UntrustedState(f"annotation {ANNOTATION}: inPlaceGeneration is not a gang generation ({in_place!r})")
    elastic = {k: record.get(k) for k in ("gangNodes", "capacityBackStep")}
    if any(v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0) for v in elastic.values()):
        raise UntrustedState(f"annotation {ANNOTATION}: gangNodes and capacityBackStep must be counts")
    texts = {k: record.get(k) for k in ("phase", "startTime", "completionTime")}
    if any(v is not None and not isinstance(v, str) for v in texts.values()):
        raise UntrustedState(f"annotation {ANNOTATION}: phase, startTime and completionTime must be strings")
    succeeded = record.get("succeededRanks", [])
    if not isinstance(succeeded, list) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in succeeded):
        raise UntrustedState(f"annotation {ANNOTATION}: succeededRanks is not a list of ranks")
    return TrustedState(
        accepted_spec=spec,
        succeeded_ranks=tuple(sorted(set(succeeded))),
        restarts=counts["restarts"],
        evictions=counts["evictions"],
        restarts_ignoring_backoff=counts["restartsIgnoringBackoff"],
        restarts_in_place=counts["restartsInPlace"],
        in_place_generation=in_place,
        phase=texts["phase"],
        start_time=texts["startTime"],
        completion_time=texts["completionTime"],
        gang_nodes=elastic["gangNodes"],
        resizes=counts["resizes"],
        capacity_back_step=elastic["capacityBackStep"],
    )


def read_state(body: Mapping[str, Any], key: bytes) -> TrustedState | None:
    """The operator's record of the job; None when there is none. Raises UntrustedState."""
    annotations = ((body.get("metadata") or {}).get("annotations")) or {}
    text = annotations.get(ANNOTATION)
    if text is None:
        return None
    if not isinstance(text, str):
        raise UntrustedState(f"annotation {ANNOTATION} is not a string")
    return decode(text, key, JobIdentity.of(body))


def state_of(status: DistributedTrainingStatus, succeeded_ranks: Iterable[int] = ()) -> TrustedState | None:
    """The record of a status the operator just computed (None for a job it never accepted)."""
    if status.accepted_spec is None:
        return None
    elastic = status.elastic
    return TrustedState(
        succeeded_ranks=tuple(sorted(set(succeeded_ranks))),
        accepted_spec=dict(status.accepted_spec),
        restarts=status.restarts,
        evictions=status.evictions,
        restarts_ignoring_backoff=status.restarts_ignoring_backoff,
        restarts_in_place=status.restarts_in_place,
        in_place_generation=status.in_place_generation,
        phase=status.phase,
        start_time=status.start_time,
        completion_time=status.completion_time,
        gang_nodes=elastic.nodes if elastic is not None else None,
        resizes=elastic.resizes if elastic is not None else 0,
        capacity_back_step=elastic.capacity_back_step if elastic is not None else None,
    )


def state_patch(state: TrustedState, key: bytes, job: JobIdentity) -> dict[str, Any]:
    """The merge patch of the object that records `state`, signed for `job`."""
    return {"metadata": {"annotations": {ANNOTATION: state.encode(key, job)}}}


def trusted_previous(
    read: DistributedTrainingStatus, state: TrustedState | None, pod_generations: Sequence[int] = ()
) -> DistributedTrainingStatus:
    """The status a reconcile starts from: what the operator recorded, over the status it read.

    The status read supplies only what decides nothing (conditions, node counts, artifacts,
    progress). Without a record the job was never accepted: it starts afresh, from the gang
    generation of the pods the operator created (their labels are the operator's own), except
    that a job that failed validation keeps its failure until its spec is fixed.
    """
    if state is not None:
        # The size and the growth are the operator's record; the rest of status.elastic only describes them.
        elastic = (read.elastic or ElasticStatus()).model_copy(
            update={"nodes": state.gang_nodes, "resizes": state.resizes, "capacity_back_step": state.capacity_back_step}
        )
        return read.model_copy(
            update={
                "elastic": elastic if state.gang_nodes is not None else None,
                "accepted_spec": dict(state.accepted_spec),
                "restarts": state.restarts,
                "evictions": state.evictions,
                "restarts_ignoring_backoff": state.restarts_ignoring_backoff,
                "restarts_in_place": state.restarts_in_place,
                "in_place_generation": state.in_place_generation,
                "phase": state.phase,
                "start_time": state.start_time,
                "completion_time": state.completion_time,
            }
        )
    failed = read.phase == "Failed" and read.accepted_spec is None
    return DistributedTrainingStatus(
        phase="Failed" if failed else None,
        conditions=read.conditions if failed else [],
        completion_time=read.completion_time if failed else None,
        restarts=max(pod_generations, default=0),
        progress=read.progress,
        last_checkpoint=read.last_checkpoint,
    )


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
