"""The condition types and reasons the operator sets, and Kubernetes' condition semantics.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from dtrain_operator.api import (
    Condition,
)
from dtrain_operator.api.redaction import redact_text
from dtrain_operator.core import policy
from dtrain_operator.core.observation import format_time

# Condition types.
CREATED = "Created"
RUNNING = "Running"
RESTARTING = "Restarting"
TRAINING_SUCCEEDED = "TrainingSucceeded"
ENGINE_BUILT = "EngineBuilt"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
PODS_PENDING = "PodsPending"
SPEC_IMMUTABLE = "SpecImmutable"
STATUS_UNREADABLE = "StatusUnreadable"
PODS_STUCK = "PodsStuckTerminating"
IMAGE_PULL = "ImagePullFailing"
# A job without shared storage whose checkpoints are on a pod-local emptyDir: they die with the pod.
POD_LOCAL_STORAGE = "PodLocalStorage"
# Training succeeded but rank 0 could not export model.onnx (the trainer's results say why).
EXPORT_FAILED = policy.REASON_EXPORT_FAILED

REASON_INVALID_SPEC = "InvalidSpec"
REASON_ENGINE_BUILD_FAILED = policy.REASON_ENGINE_BUILD_FAILED
REASON_IMMUTABLE_FIELD_CHANGED = "ImmutableFieldChanged"
REASON_INVALID_SPEC_CHANGE = "InvalidSpecChange"
REASON_UNREADABLE_STATUS = "UnreadableStatus"
REASON_IMAGE_PULL_FAILED = "ImagePullFailed"
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
