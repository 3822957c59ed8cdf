"""What the client raises: every failure is a DtrainError whose message says what to do.
"""

from __future__ import annotations

from collections.abc import Sequence

from dtrain_operator import api


class DtrainError(Exception):
    """A request dtrain could not do; the message says what to do about it."""


class NoCrdError(DtrainError):
    """The cluster does not serve dtrain.dev/v1alpha1: the CRD (and so the operator) is not installed."""


class PermissionDenied(DtrainError):
    """The API server refused the request (401 or 403)."""


class NotFound(DtrainError):
    """The job (or its pod) does not exist."""


class AlreadyExists(DtrainError):
    """A job of that name exists already in the namespace."""


class InvalidJob(DtrainError):
    """The job file or dict does not validate; `errors` are the lines `dtrain validate` prints."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


class WaitTimeout(DtrainError):
    """wait() ran out of time; `job` is the job as last seen."""

    def __init__(self, message: str, job: api.DistributedTraining | None) -> None:
        super().__init__(message)
        self.job = job


class ConnectionFailed(DtrainError):
    """No answer from the API server, or no credentials to ask it with."""


class ApiRequestError(DtrainError):
    """Any other refusal by the API server: its HTTP status, reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"the API server answered {status} {reason}: {message}")
        self.status = status
        self.reason = reason
