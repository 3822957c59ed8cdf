"""Conditions about where the checkpoints live, each with a Warning Event when it turns True.

- PodLocalStorage (at creation): a job without shared storage keeps its checkpoints on a pod-local emptyDir.
- CheckpointMissed: a checkpoint the trainer could not write (object storage, after its retries). Training
  goes on and the next checkpoint tries again; until one is written, status.lastCheckpoint.missed says which
  step was missed and why.
"""

from __future__ import annotations

from dtrain_operator.api import DistributedTraining, DistributedTrainingStatus, job_dirs, storage
from dtrain_operator.api.reasons import condition_type, reason

POD_LOCAL_REASON = reason("CheckpointsDieWithThePod", "the checkpoints are on a pod-local emptyDir (PodLocalStorage)",
                          storage.NO_SHARED_STORAGE_FIX)
CONDITION = condition_type(
    "CheckpointMissed", "the trainer could not write a checkpoint (after its retries); training goes on and the next "
    "checkpoint tries again; status.lastCheckpoint.missed says which and why",
    "check the storage the message names (credentials, space, reachability)",
)
REASON_MISSED = reason("CheckpointNotWritten", "a checkpoint could not be written (CheckpointMissed)",
                       "check the storage the message names")
REASON_WRITTEN = reason("CheckpointsWritten", "the newest checkpoint was written (CheckpointMissed False)")


def pod_local_message(job: DistributedTraining) -> str | None:
    """What PodLocalStorage says, or None when the checkpoints are on shared storage."""
    if not job_dirs.is_pod_local(job.spec, job.namespace, job.name):
        return None
    return (
        f"checkpoints are on a pod-local emptyDir at {storage.POD_LOCAL_ROOT}: they do not outlive the pod, so a "
        f"restart trains from the start; {storage.NO_SHARED_STORAGE_FIX}"
    )


def missed_message(status: DistributedTrainingStatus) -> str | None:
    """What the condition says, or None when the newest checkpoint was written."""
    last = status.last_checkpoint
    missed = last.missed if last is not None else None
    if missed is None:
        return None
    newest = f"the newest written is step {last.step} ({last.path})" if last is not None and last.step is not None else (
        "no checkpoint is written yet"
    )
    return (
        f"the checkpoint of step {missed.step} could not be written to {missed.path} ({missed.error}); training goes "
        f"on and the next checkpoint tries again; {newest}"
    )
