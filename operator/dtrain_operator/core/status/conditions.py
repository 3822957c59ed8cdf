"""The condition types and reasons the operator sets, and Kubernetes' condition semantics.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from dtrain_operator.api import (
    Condition,
)
from dtrain_operator.api.reasons import condition_type, reason
from dtrain_operator.api.redaction import redact_text
from dtrain_operator.api.storage import NO_SHARED_STORAGE_FIX
from dtrain_operator.core import policy
from dtrain_operator.core.observation import format_time

# Condition types.
CREATED = condition_type("Created", "the operator accepted the job and creates its Service and worker pods")
RUNNING = condition_type(
    "Running", "every worker pod of the gang runs (False while the gang restarts or resizes, and once the job ended)"
)
RESTARTING = condition_type(
    "Restarting", "the gang restarts from its last checkpoint: the reason says why, the message how (in place or by "
    "recreating its pods)", "read the message; `dtrain logs NAME --previous` shows the failed worker's log",
)
TRAINING_SUCCEEDED = condition_type(
    "TrainingSucceeded", "rank 0 exited 0: training is over; the ONNX export and the engine build come next"
)
ENGINE_BUILT = condition_type(
    "EngineBuilt", "the engine Job built the TensorRT engine (False while it builds, or with the reason it failed)"
)
SUCCEEDED = condition_type("Succeeded", "the job ended well; the reason says how far it went")
FAILED = condition_type(
    "Failed", "the job ended and will not restart: the reason says why, the message quotes the cause",
    "look the reason up on this page; fix the cause and create the job again",
)
SUSPENDED = condition_type(
    "Suspended", "runPolicy.suspend is true: the worker pods are deleted",
    "set runPolicy.suspend to false: the gang starts again from its last checkpoint",
)
PODS_PENDING = condition_type(
    "PodsPending", "a worker pod is Pending beyond scheduling.gang.scheduleTimeoutSeconds; the message quotes the "
    "scheduler's reason", "make room for the gang (GPUs, nodeSelector, tolerations, quota), or ask for fewer nodes",
)
SPEC_IMMUTABLE = condition_type(
    "SpecImmutable", "an edit of the spec is not applied; the job runs on with the spec it was created with",
    "revert the edit, or delete the DistributedTraining and create it again",
)
STATUS_UNREADABLE = condition_type(
    "StatusUnreadable", "the operator cannot read the job's status in full; it leaves the pods alone until it can",
    "fix or remove what the message names (kubectl patch --subresource=status)",
)
PODS_STUCK = condition_type(
    "PodsStuckTerminating", "worker pods still terminate long after their grace period (is the node gone?); a new "
    "gang waits for their names", "check their node; the operator force-deletes those whose node is not Ready",
)
IMAGE_PULL = condition_type(
    "ImagePullFailing", "a worker pod cannot pull its image; the job fails with ImagePullFailed if it still cannot "
    "within the operator's --image-pull-timeout", "check the image's name and tag, the registry and imagePullSecrets",
)
# A job without shared storage whose checkpoints are on a pod-local emptyDir: they die with the pod.
POD_LOCAL_STORAGE = condition_type(
    "PodLocalStorage", "the job has no shared storage: its checkpoints die with the pod, and a restart trains from "
    "the start", NO_SHARED_STORAGE_FIX,
)
# Training succeeded but rank 0 could not export model.onnx (the trainer's results say why).
EXPORT_FAILED = condition_type(
    policy.REASON_EXPORT_FAILED, "training succeeded, but rank 0 could not export model.onnx: the message says why",
    "make the model exportable (`dtrain run` shows the same export on one machine)",
)

REASON_INVALID_SPEC = reason(
    "InvalidSpec", "the object does not validate: the operator created nothing",
    "fix the spec as the message says (`dtrain validate` says the same offline) and apply it again",
)
REASON_ENGINE_BUILD_FAILED = policy.REASON_ENGINE_BUILD_FAILED
REASON_IMMUTABLE_FIELD_CHANGED = reason(
    "ImmutableFieldChanged", "fields that cannot change after creation were edited (SpecImmutable)",
    "revert the edit, or delete the DistributedTraining and create it again",
)
REASON_INVALID_SPEC_CHANGE = reason(
    "InvalidSpecChange", "an edit made the spec invalid (SpecImmutable)", "fix or revert the edit"
)
REASON_UNREADABLE_STATUS = reason(
    "UnreadableStatus", "a field of the status cannot be read (StatusUnreadable)", "fix or remove what the message names"
)
REASON_IMAGE_PULL_FAILED = reason(
    "ImagePullFailed", "worker pods could not pull their image within --image-pull-timeout (Failed)",
    "fix the image or its pull secret, then create the job again",
)
# The reasons of the status's own steps.
REASON_JOB_CREATED = reason("JobCreated", "the first status of an accepted job (Created)")
REASON_SPEC_UNCHANGED = reason("SpecUnchanged", "the spec matches the one the job was created with (SpecImmutable False)")
REASON_STATUS_READ = reason("StatusRead", "the operator reads the whole status again (StatusUnreadable False)")
REASON_TERMINATION_TIMEOUT = reason(
    "TerminationTimeout", "worker pods still terminate --stuck-terminating-timeout seconds after their grace period "
    "(PodsStuckTerminating)", "check their node: a pod on a node that is not Ready is force-deleted",
)
REASON_NO_POD_STUCK = reason("NoPodStuck", "no worker pod is stuck terminating (PodsStuckTerminating False)")
REASON_JOB_SUSPENDED = reason(
    "JobSuspended", "runPolicy.suspend is true (Suspended; Running and PodsPending False)",
    "set runPolicy.suspend to false to resume",
)
REASON_JOB_RESUMED = reason("JobResumed", "runPolicy.suspend is false again: the gang starts (Suspended False)")
REASON_IMAGES_PULLED = reason("ImagesPulled", "no worker pod waits on an image it cannot pull (ImagePullFailing False)")
REASON_IMAGE_PULL_BACK_OFF = reason(
    "ImagePullBackOff", "a worker pod cannot pull its image (ImagePullFailing); the message names the pods",
    "check the image's name and tag, the registry and imagePullSecrets",
)
REASON_ALL_WORKERS_RUNNING = reason("AllWorkersRunning", "every worker pod of the gang runs (Running)")
REASON_GANG_RUNNING = reason("GangRunning", "the restarted gang runs (Restarting False)")
REASON_GANG_RESIZING = reason("GangResizing", "an elastic gang restarts on another number of nodes (Running False)")
REASON_GANG_RESTARTING = reason("GangRestarting", "the gang restarts (Running False); the Restarting condition says why")
REASON_PODS_PENDING_TOO_LONG = reason(
    "PodsPendingTooLong", "worker pods are Pending beyond scheduling.gang.scheduleTimeoutSeconds (PodsPending)",
    "`kubectl describe pod` on the pods named: make room for them, or ask for fewer nodes",
)
REASON_PODS_STARTED = reason("PodsStarted", "no worker pod is Pending beyond the schedule timeout (PodsPending False)")
REASON_JOB_FINISHED = reason("JobFinished", "the job ended (Running and Restarting False); Succeeded or Failed says how")
REASON_TRAINER_SUCCEEDED = reason("TrainerSucceeded", "rank 0's pod exited 0 (TrainingSucceeded)")
REASON_ENGINE_JOB_SUCCEEDED = reason("EngineJobSucceeded", "the engine Job built the TensorRT engine (EngineBuilt)")
REASON_ENGINE_BUILDING = reason("EngineBuilding", "the engine Job is building the TensorRT engine (EngineBuilt False)")
# Condition messages stay short enough to read in `kubectl describe`; termination messages can be 4 KiB.
MAX_MESSAGE_CHARS = 1024


def truncate_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


ConditionStatus = Literal["True", "False", "Unknown"]


class Conditions:
    """Kubernetes condition semantics: lastTransitionTime moves only when the status flips."""

    def __init__(self, conditions: Sequence[Condition], now: datetime) -> None:
        self._items = [c.model_copy() for c in conditions]
        self._now = format_time(now)

    def get(self, type_: str) -> Condition | None:
        return next((c for c in self._items if c.type == type_), None)

    def is_true(self, type_: str) -> bool:
        condition = self.get(type_)
        return condition is not None and condition.status == "True"

    def set(self, type_: str, status: bool | ConditionStatus, reason: str, message: str) -> None:
        value: ConditionStatus = status if isinstance(status, str) else "True" if status else "False"
        # Messages quote trainer logs and termination messages, and become Events that `view` can read.
        message = truncate_message(redact_text(message))
        condition = self.get(type_)
        if condition is None:
            self._items.append(
                Condition(type=type_, status=value, reason=reason, message=message, last_transition_time=self._now)
            )
            return
        if condition.status != value:
            condition.last_transition_time = self._now
        condition.status, condition.reason, condition.message = value, reason, message

    def clear(self, type_: str, reason: str, message: str) -> None:
        """Set False, but only if the condition was ever set: absent conditions stay absent."""
        if self.get(type_) is not None:
            self.set(type_, False, reason, message)

    def items(self) -> list[Condition]:
        return self._items
