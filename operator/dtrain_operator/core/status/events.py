"""What the operator writes after computing a status: the patch of the fields it owns, and the Events
that a phase change or a warning condition asks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dtrain_operator.api import (
    DistributedTrainingStatus,
    ElasticStatus,
)
from dtrain_operator.api.common import Phase
from dtrain_operator.api.failure_rules import STRATEGY_RECREATE
from dtrain_operator.api.reasons import event
from dtrain_operator.api.record_patches import TRAINER_FIELDS
from dtrain_operator.core import queueing, stragglers
from dtrain_operator.core.status import gpu_memory, restarts, storage_conditions
from dtrain_operator.core.status.conditions import (
    ENGINE_BUILT,
    FAILED,
    IMAGE_PULL,
    POD_LOCAL_STORAGE,
    PODS_PENDING,
    PODS_STUCK,
    RESTARTING,
    RUNNING,
    SPEC_IMMUTABLE,
    STATUS_UNREADABLE,
    SUCCEEDED,
    SUSPENDED,
)

# The status fields the operator writes: every field but what rank 0 reports.
OWNED_FIELDS = tuple(
    field.alias or name for name, field in DistributedTrainingStatus.model_fields.items()
    if (field.alias or name) not in TRAINER_FIELDS
)


def _owned(status: DistributedTrainingStatus | None) -> dict[str, Any]:
    if status is None:
        return {}
    wire = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    return {k: wire[k] for k in OWNED_FIELDS if k in wire}


def status_patch(
    previous: DistributedTrainingStatus | None, new: DistributedTrainingStatus
) -> dict[str, Any] | None:
    """The merge patch of `status` that turns `previous` into `new`, or None when nothing changed."""
    return _merge_patch(_owned(previous), _owned(new)) or None


def _merge_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What changed from `before` to `after` as a JSON merge patch: a merge patch merges maps, so a key that
    disappeared from one (goodput's category once the job finished, an artifact) is nulled explicitly."""
    patch: dict[str, Any] = {}
    for key, value in after.items():
        old = before.get(key)
        if old != value:
            patch[key] = _merge_patch(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) else value
    patch.update({key: None for key in before if key not in after})
    return patch


def worth_batching(patch: Mapping[str, Any]) -> bool:
    """True when a status patch changes nothing but node counts, the goodput, and the phase to a quiet one (Pending,
    Starting: no Event): not urgent, so that pods scheduled and started together share one patch."""
    quiet_phase = "phase" not in patch or patch["phase"] in QUIET_PHASES
    return quiet_phase and set(patch) - {"goodput"} <= {"nodes", "nodesReady", "phase"}


@dataclass(frozen=True)
class JobEvent:
    """A Kubernetes Event to post on the DistributedTraining."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    series: bool = False
    """Repeats of it are one Event with a count and a last-seen time (as Kubernetes' event series), not many."""


# Conditions that need the user: a Warning Event, its reason the condition's type, each time one turns True or
# says something new.
WARNING_CONDITIONS = (
    SPEC_IMMUTABLE, PODS_PENDING, STATUS_UNREADABLE, PODS_STUCK, IMAGE_PULL, gpu_memory.CONDITION, POD_LOCAL_STORAGE,
    storage_conditions.CONDITION, queueing.NOT_HONORED_CONDITION, stragglers.CONDITION,
)


# The Event that says how a gang restart is made, and why (status.lastRestart), when no Restarting Event says it.
RESTART_EVENT_REASONS = {
    "InPlace": event("RestartInPlace", "Normal", "the new gang generation starts in the same pods (torchrun again)"),
    "Recreate": event("RestartByRecreate", "Normal", "the new gang generation starts in new pods; the message says "
                      "why not in place"),
}

# Every phase change is an Event whose reason is the new phase and whose message says what it means for the job now,
# but for the first steps of every start (Pending, Starting): the phase shows them, and what holds a job there has a
# Warning of its own (PodsPending, ImagePullFailing, CreateRefused). An Event is an API request: three within seconds
# of each start said nothing the Running Event does not.
QUIET_PHASES = ("Pending", "Starting")
WARNING_PHASES = ("Failed", "Restarting")
_PHASES: dict[Phase, tuple[str, str]] = {
    "Queued": ("the job waits in its Kueue LocalQueue (the Queued condition)", ""),
    "Running": ("every worker pod runs and trains", ""),
    "Restarting": ("the gang restarts from its last checkpoint (the Restarting condition says why)",
                   "see the Restarting condition's reason"),
    "Exporting": ("rank 0 exports the model to ONNX", ""),
    "BuildingEngine": ("the engine Job builds the TensorRT engine", ""),
    "Succeeded": ("the job ended well (the Succeeded condition says how far it went)", ""),
    "Failed": ("the job ended and will not restart (the Failed condition says why)", "see the Failed condition's reason"),
    "Suspended": ("runPolicy.suspend is true: the worker pods are deleted", "set runPolicy.suspend to false to resume"),
}
PHASE_EVENTS = {
    phase: event(phase, "Warning" if phase in WARNING_PHASES else "Normal", meaning, action)
    for phase, (meaning, action) in _PHASES.items()
}

_PHASE_CONDITION = {
    "Running": RUNNING,
    "Exporting": RUNNING,
    "Restarting": RESTARTING,
    "BuildingEngine": ENGINE_BUILT,
    "Succeeded": SUCCEEDED,
    "Failed": FAILED,
    "Suspended": SUSPENDED,
    "Queued": queueing.CONDITION,
}


def phase_message(status: DistributedTrainingStatus) -> str:
    """One line that says what the phase means for this job right now."""
    if status.phase == "Exporting":
        return "rank 0 is exporting the model to ONNX"
    condition_type = _PHASE_CONDITION.get(status.phase or "")
    condition = next((c for c in status.conditions if c.type == condition_type), None)
    return condition.message if condition is not None else ""


def status_events(
    previous: DistributedTrainingStatus | None, new: DistributedTrainingStatus
) -> list[JobEvent]:
    """Events for what changed: a phase change (but to Pending or Starting), and warnings that need the user."""
    events: list[JobEvent] = []
    old_phase = previous.phase if previous else None
    changed_to = new.phase if new.phase != old_phase and new.phase in PHASE_EVENTS else None
    if changed_to is not None:
        kind: Literal["Normal", "Warning"] = "Warning" if changed_to in WARNING_PHASES else "Normal"
        events.append(JobEvent(kind, PHASE_EVENTS[changed_to], phase_message(new)))
    restart = new.last_restart
    # A restart that turns the phase to Restarting is said by that Event (its condition's message says how); the
    # strategy's own Event is for a restart whose strategy changes on the way (an in-place restart recreating).
    if restart is not None and restart != (previous.last_restart if previous else None) and changed_to != "Restarting":
        strategy = restart.strategy or STRATEGY_RECREATE
        events.append(JobEvent(
            "Normal", RESTART_EVENT_REASONS[strategy],
            f"gang generation {restart.generation} starts {restarts.HOW[strategy]}: {restart.why}",
        ))
    events.extend(_resize_events(previous.elastic if previous else None, new.elastic))
    before = {c.type: c for c in (previous.conditions if previous else [])}
    for condition in new.conditions:
        if condition.type not in WARNING_CONDITIONS or condition.status != "True":
            continue
        old = before.get(condition.type)
        if old is None or old.status != "True" or old.message != condition.message:
            events.append(JobEvent("Warning", condition.type, condition.message, series=True))
    return events


# The Events of an elastic gang's resize (status.elastic): a smaller gang is a warning, a whole one news.
EVENT_GANG_SHRUNK = event("GangShrunk", "Warning", "an elastic gang trains on fewer nodes (status.elastic)",
                          "nothing: it grows back once the nodes return")
EVENT_GANG_GROWN = event("GangGrown", "Normal", "an elastic gang is whole again (status.elastic)")


def _resize_events(previous: ElasticStatus | None, new: ElasticStatus | None) -> list[JobEvent]:
    if new is None or new.resizes <= (previous.resizes if previous else 0) or not new.last_resize:
        return []
    shrunk = new.nodes is not None and new.wanted_nodes is not None and new.nodes < new.wanted_nodes
    return [JobEvent("Warning" if shrunk else "Normal", EVENT_GANG_SHRUNK if shrunk else EVENT_GANG_GROWN, new.last_resize)]
