"""Checkpoints on object storage, and whose checkpoint a start may resume from.

On s3:// and gs:// a save is two writes, in this order: the checkpoint `step=<8 digits>.ckpt`,
streamed by torch.save into a multipart upload (memory holds one part, and the object exists
only once the whole of it is committed), then the pointer `last.json` naming it. A start resumes
from the checkpoint the pointer names: a checkpoint whose upload was cut short is never named,
and one whose pointer write was cut short is simply not used (the one before it is). An upload that
fails after its retries is reported and training goes on to the next checkpoint.

Every checkpoint, on a disk or in a bucket, records its owner (`CheckpointOwner`: the job's
namespace, name and uid, and the hash of its model, data and trainer settings). A start refuses a
checkpoint of another owner unless `checkpoint.foreign` says to start fresh or resume all the same.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import torch

from dtrain_common import object_store
from dtrain_common.errors import ConfigError
from dtrain_operator.api import CheckpointOwner, SurvivorMark, TrainerConfig, contract
from dtrain_operator.api.job import training_hash
from dtrain_operator.api.records import Event
from dtrain_trainer.progress import ProgressReporter

log = logging.getLogger("dtrain_trainer")

LAST_POINTER = contract.LAST_POINTER_FILE_NAME
OWNER_KEY = contract.CHECKPOINT_OWNER_KEY


def upload_checkpoint(checkpoint: Mapping[str, Any], url: str) -> object_store.Upload:
    """Stream `checkpoint` to `url` with retries; the outcome, never an exception for a storage error."""
    return object_store.with_retries(url, lambda: object_store.stream_to(url, lambda f: torch.save(checkpoint, f)))


def load_checkpoint(url: str, map_location: Any = None) -> dict[str, Any]:
    fs, path = object_store.filesystem(url)
    with fs.open(path, "rb") as handle:
        return torch.load(handle, map_location=map_location or "cpu", weights_only=False)  # type: ignore[no-any-return]


def write_pointer(
    directory: str, checkpoint_url: str, step: int, survivor: SurvivorMark | None = None
) -> object_store.Upload:
    """Name `checkpoint_url` (already uploaded whole) as the newest checkpoint of `directory`; `survivor`: a
    rank that outlived a lost peer wrote it (dtrain_trainer.survivor), said in the pointer too."""
    name = checkpoint_url.rstrip("/").rsplit("/", 1)[-1]
    pointer: dict[str, Any] = {"checkpoint": name, "step": step}
    if survivor is not None:
        pointer["survivor"] = survivor.to_wire()
    body = json.dumps(pointer).encode()
    return object_store.put_bytes(object_store.join(directory, LAST_POINTER), body)


def find_object_checkpoint(directory: str) -> str | None:
    """The checkpoint a start in `directory` (s3:// or gs://) resumes from: the pointer's; None for a fresh start."""
    pointer = object_store.read_json(object_store.join(directory, LAST_POINTER))
    name = pointer.get("checkpoint") if isinstance(pointer, dict) else None
    if not isinstance(name, str) or "/" in name:
        return None
    url = object_store.join(directory, name)
    if not object_store.exists(url):
        log.warning("%s names %s, which is gone; starting without it", LAST_POINTER, url)
        return None
    return url


def owner_of(config: TrainerConfig) -> CheckpointOwner:
    return CheckpointOwner(
        namespace=config.job_namespace,
        name=config.job_name,
        uid=config.job_uid,
        training_hash=training_hash(config),
    )


def _recorded_owner(checkpoint: Mapping[str, Any]) -> CheckpointOwner | None:
    recorded = checkpoint.get(OWNER_KEY)
    if not isinstance(recorded, dict):
        return None
    try:
        return CheckpointOwner.model_validate(recorded)
    except ValueError:
        return None


def foreign_reason(checkpoint: Mapping[str, Any], own: CheckpointOwner) -> str | None:
    """Why `checkpoint` is not this job's to resume from, or None when it is."""
    recorded = _recorded_owner(checkpoint)
    if recorded is None:
        return "it records no job (an older dtrain, or another program, wrote it)"
    return own.mismatch(recorded)


def decide_resume(checkpoint: Mapping[str, Any], path: str, config: TrainerConfig) -> tuple[bool, str | None]:
    """Whether to resume from `checkpoint`, and the warning to give; a ConfigError when the spec refuses it."""
    reason = foreign_reason(checkpoint, owner_of(config))
    if reason is None:
        return True, None
    policy = config.checkpoint.foreign
    if policy == "Refuse":
        raise ConfigError(
            f"checkpoint.dir: {path} is not this job's checkpoint: {reason}. Give the job its own checkpoint.dir "
            "(the default is per job), or set checkpoint.foreign: StartFresh (train from scratch) or Resume "
            "(continue from it all the same)"
        )
    if policy == "StartFresh":
        return False, f"checkpoint.foreign StartFresh: not resuming from {path} ({reason}); training from scratch"
    return True, f"checkpoint.foreign Resume: resuming from {path} although {reason}"


class CheckpointWriteFailed(RuntimeError):
    """A checkpoint not written, with checkpoint.onWriteFailure: Fail: training stops here."""


def reported_failure(step: int, url: str, error: str | None, stop: bool = False) -> str:
    then = ("checkpoint.onWriteFailure is Fail: training stops" if stop
            else "training goes on and the next checkpoint tries again")
    return f"checkpoint of step {step} not saved: {url} could not be written after retries ({error}); {then}"


def report_saved(
    reporter: ProgressReporter, step: int, path: str, upload: object_store.Upload | None, survivor: SurvivorMark | None = None
) -> None:
    """A checkpoint saved whole; on object storage with its size and how long its upload took; by whom when a
    survivor of a lost peer wrote it."""
    timing = {"bytes": upload.bytes, "uploadSeconds": round(upload.seconds, 3), "attempts": upload.attempts} if upload else {}
    if survivor is not None:
        timing["survivor"] = survivor.to_wire()
    reporter.event(Event.CHECKPOINT, step=step, path=path, ok=True, **timing)


def report_failed(reporter: ProgressReporter, step: int, upload: object_store.Upload, stop: bool = False) -> None:
    """A checkpoint that could not be uploaded: said in the log and the records; training goes on unless `stop`."""
    message = reported_failure(step, upload.url, upload.error, stop)
    log.warning(message)
    reporter.event(Event.CHECKPOINT, step=step, path=upload.url, ok=False, error=upload.error, attempts=upload.attempts)
    reporter.event(Event.WARNING, message=message)
    if stop:
        raise CheckpointWriteFailed(message)
