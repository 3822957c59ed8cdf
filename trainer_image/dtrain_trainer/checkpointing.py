"""Checkpoints every N optimizer steps, and the choice of the one a (gang) restart resumes from.

Files in checkpoint.dir: `step=<8 digits>.ckpt` (the newest keepLast of them) and
`last.ckpt`, written in that order at every save, and once more at the end of training.
Each file is written by `AtomicCheckpointIO`: into a hidden temporary file in the same
directory (never the container's small /tmp), flushed to disk, then renamed into place,
so a file under a checkpoint's name is always complete; a full disk leaves no file behind
and says so. The resume choice also skips a file that is not a complete zip archive
(torch.save's format), so a pod killed while writing cannot wedge the job.

On object storage (s3://, gs://) the step checkpoint is uploaded once and `last.json` names
it (dtrain_trainer.checkpoint_store); an upload that fails after its retries is reported and
training goes on (or stops: checkpoint.onWriteFailure). Every checkpoint records the job it belongs to (checkpoint_store.OWNER_KEY).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins import TorchCheckpointIO

from dtrain_common import object_store
from dtrain_common.errors import ConfigError
from dtrain_operator.api import SurvivorMark, contract
from dtrain_operator.api.storage import is_object_url
from dtrain_trainer import checkpoint_store, flavor

log = logging.getLogger("dtrain_trainer")

LAST_CHECKPOINT = contract.LAST_CHECKPOINT_FILE_NAME
STEP_FILE_PATTERN = re.compile(r"^step=(\d+)\.ckpt$")


class _StepCheckpointBehaviour:
    """ModelCheckpoint keeping the newest `keep_last` step checkpoints plus last.ckpt.

    Two additions to Lightning's behaviour: it always saves at the end of training (Lightning
    saves only on the step grid), and it tells `on_saved(step, path)` on rank 0 about each
    new checkpoint. Lightning has no public way to do either (Callback.on_save_checkpoint sees
    no path, and no public method saves on demand), so both use ModelCheckpoint's private
    members: pyproject.toml pins the Lightning minors that have them, and
    tests/trainer/test_lightning_private_members.py names the one a newer Lightning changed.
    """

    def __init__(
        self,
        dirpath: str,
        every_n_steps: int,
        keep_last: int,
        on_saved: Callable[[int, str, object_store.Upload | None, SurvivorMark | None], None] | None = None,
        on_failed: Callable[[int, object_store.Upload], None] | None = None,
    ) -> None:
        super().__init__(  # type: ignore[call-arg]
            dirpath=dirpath,
            filename="{step:08d}",
            every_n_train_steps=every_n_steps,
            save_last=True,
            # "step" only grows, so the top k by step are the newest k.
            monitor="step",
            mode="max",
            save_top_k=keep_last,
            # Overwrite last.ckpt rather than add last-v1.ckpt next to a previous run's file.
            enable_version_counter=False,
        )
        self.on_saved = on_saved
        self.on_failed = on_failed
        self._reported_step: int | None = None
        # The newest checkpoint saved whole (rank 0): the one the export records and a SIGTERM reports.
        self.latest_path: str | None = None
        self._latest_step: int | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # The starting state is saved already (the checkpoint resumed from, or nothing trained):
        # without this, a resumed run rewrites its own checkpoint at the first batch.
        self._last_global_step_saved = trainer.global_step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save_now(trainer)

    def save_now(self, trainer: L.Trainer) -> None:
        """Save the current step (a step file and last.ckpt) unless it is saved already; every rank calls it."""
        if self._last_global_step_saved != trainer.global_step:
            candidates = self._monitor_candidates(trainer)  # type: ignore[attr-defined]
            self._save_topk_checkpoint(trainer, candidates)  # type: ignore[attr-defined]
            self._save_last_checkpoint(trainer, candidates)  # type: ignore[attr-defined]

    @property
    def saved_step(self) -> int | None:
        """The step this rank knows saved last (the one resumed from counts)."""
        return self._last_global_step_saved  # type: ignore[attr-defined,no-any-return]

    def save_alone(self, trainer: L.Trainer, checkpoint: dict[str, Any], step: int, survivor: SurvivorMark) -> str:
        """Write `checkpoint`, of `step`, as this callback's save of that step is written, by this rank alone.

        For a survivor of a lost peer (dtrain_trainer.survivor): no collective (save_now's Lightning path
        has a barrier and saves on rank 0 only), the same files in the same order through the same atomic
        writer (the step file, then last.ckpt or the pointer), the same keepLast bookkeeping (recorded in
        the checkpoint, so that the resumed run prunes this file in turn) and the same report.
        """
        path = self.format_checkpoint_name({"step": step})  # type: ignore[attr-defined]
        pruned = self._admit(path, step)
        callbacks = checkpoint.get("callbacks")
        if isinstance(callbacks, dict):
            callbacks[self.state_key] = self.state_dict()  # type: ignore[attr-defined]
        checkpoint_io = trainer.strategy.checkpoint_io
        checkpoint_io.save_checkpoint(checkpoint, path)
        written: object_store.Upload | None = getattr(checkpoint_io, "last_upload", None)
        upload = written if written is not None and written.url == path else None
        if upload is not None and not upload.ok:
            raise CheckpointWriteError(checkpoint_store.reported_failure(step, path, upload.error))
        if is_object_url(str(self.dirpath)):
            pointer = checkpoint_store.write_pointer(str(self.dirpath), path, step, survivor)
            if not pointer.ok:
                raise CheckpointWriteError(checkpoint_store.reported_failure(step, pointer.url, pointer.error))
        else:
            checkpoint_io.save_checkpoint(checkpoint, self.last_model_path)  # type: ignore[attr-defined]
        for old in pruned:
            checkpoint_io.remove_checkpoint(old)
        self.latest_path, self._latest_step = path, step
        self._last_global_step_saved = step
        if self.on_saved is not None:
            self.on_saved(step, path, upload, survivor)
        return path

    def _admit(self, path: str, step: int) -> list[str]:
        """Count `path` among the newest keepLast step checkpoints, as Lightning's top-k save does; the files it
        pushes out (monitor "step", mode "max": the lowest step goes)."""
        kept: dict[str, Any] = self.best_k_models  # type: ignore[attr-defined]
        pruned = []
        while self.save_top_k >= 0 and kept and len(kept) >= self.save_top_k:  # type: ignore[attr-defined]
            oldest = min(kept, key=lambda p: float(kept[p]))
            kept.pop(oldest)
            pruned.append(oldest)
        kept[path] = torch.tensor(step)
        self.kth_best_model_path = min(kept, key=lambda p: float(kept[p]))
        self.kth_value = kept[self.kth_best_model_path]
        self.best_model_path = max(kept, key=lambda p: float(kept[p]))
        self.best_model_score = kept[self.best_model_path]
        self.current_score = kept[path]
        if not is_object_url(str(self.dirpath)):
            self.last_model_path = str(Path(self.dirpath) / LAST_CHECKPOINT)  # type: ignore[arg-type]
        return [p for p in pruned if p != path]

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)  # type: ignore[misc]
        if not trainer.is_global_zero:
            return
        written: object_store.Upload | None = getattr(trainer.strategy.checkpoint_io, "last_upload", None)
        if written is not None and written.url == filepath and not written.ok:
            if self.on_failed is not None:
                self.on_failed(trainer.global_step, written)
            return
        self.latest_path, self._latest_step = filepath, trainer.global_step
        # The step file is written first; last.ckpt then repeats it and needs no report of its own.
        if self.on_saved is not None and self._reported_step != trainer.global_step:
            self._reported_step = trainer.global_step
            upload = written if written is not None and written.url == filepath else None
            self.on_saved(trainer.global_step, filepath, upload, None)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        if not is_object_url(self.dirpath):
            super()._save_last_checkpoint(trainer, monitor_candidates)  # type: ignore[misc]
            return
        # Object storage: no second upload; the pointer names the step checkpoint once that is whole.
        saved = self.latest_path
        # Only a checkpoint of this step that went up whole is named; a failed upload leaves the pointer as it was.
        if trainer.is_global_zero and saved is not None and self._latest_step == trainer.global_step:
            pointer = checkpoint_store.write_pointer(str(self.dirpath), saved, trainer.global_step)
            if not pointer.ok and self.on_failed is not None:
                self.on_failed(trainer.global_step, pointer)
        trainer.strategy.barrier()


@functools.cache
def step_checkpoint_class(package: str) -> type:
    """StepCheckpoint on `package`'s ModelCheckpoint (lightning.pytorch or pytorch_lightning)."""
    if package == flavor.LIGHTNING:
        return StepCheckpoint
    base = flavor.flavor(package).callbacks.ModelCheckpoint
    return type("StepCheckpoint", (_StepCheckpointBehaviour, base), {"__module__": __name__})


class StepCheckpoint(_StepCheckpointBehaviour, ModelCheckpoint):
    __doc__ = _StepCheckpointBehaviour.__doc__


class CheckpointWriteError(ConfigError):
    """A checkpoint could not be written (a full disk, a read-only volume): no restart cures it."""


class _AtomicCheckpointIOBehaviour:
    """TorchCheckpointIO whose files appear complete or not at all.

    torch.save streams into `.<name>.<unique>.tmp` beside the target, which is flushed and
    fsync'd, then renamed over the target (atomic within one file system). Unique, not the pid: two
    survivors in pods of their own may both write (see dtrain_trainer.survivor), with the same pid. Lightning's own
    writer goes through fsspec's transaction, which stages the file in the system's temp
    directory: in a container that is a small overlay, and the final move is a copy.

    `on_writing` is told True before each write and False after it (rank 0 writes; the progress
    deadline holds meanwhile). Only the write itself: Lightning's barrier after a save is a
    collective, in which a hung gang must not look like one writing a checkpoint.
    """

    on_writing: Callable[[bool], None] | None = None
    # The job every checkpoint records (checkpoint_store.OWNER_KEY), as its wire dict.
    owner: dict[str, Any] | None = None
    # How the latest upload to object storage went (rank 0).
    last_upload: object_store.Upload | None = None
    # A checkpoint loaded before fit (to check its owner), handed to Lightning's own load instead of a second one.
    _preloaded: tuple[str, dict[str, Any]] | None = None

    def preload(self, path: str) -> dict[str, Any]:
        """Load `path` now and keep it for Lightning's own load of the same path."""
        checkpoint = self.load_checkpoint(path)
        self._preloaded = (path, checkpoint)
        return checkpoint

    def forget_preloaded(self) -> None:
        self._preloaded = None

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        if self._preloaded is not None and self._preloaded[0] == str(path):
            checkpoint, self._preloaded = self._preloaded[1], None
            return checkpoint
        if is_object_url(str(path)):
            return checkpoint_store.load_checkpoint(str(path), map_location)
        return super().load_checkpoint(path, map_location=map_location or "cpu", weights_only=False)  # type: ignore[misc,no-any-return]

    def save_checkpoint(self, checkpoint: dict[str, object], path: str | os.PathLike[str], storage_options: object = None) -> None:
        if self.owner is not None:
            checkpoint = {**checkpoint, checkpoint_store.OWNER_KEY: self.owner}
        if self.on_writing is None:
            self._write(checkpoint, path, storage_options)
            return
        self.on_writing(True)
        try:
            self._write(checkpoint, path, storage_options)
        finally:
            self.on_writing(False)

    def _write(self, checkpoint: dict[str, object], path: str | os.PathLike[str], storage_options: object) -> None:
        if storage_options is not None:
            raise TypeError("dtrain's checkpoint writer takes no storage_options")
        if is_object_url(str(path)):
            self.last_upload = checkpoint_store.upload_checkpoint(checkpoint, str(path))
            return
        target = Path(path)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(temporary, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, target)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise CheckpointWriteError(_write_failure(target, exc)) from None
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise


def _write_failure(target: Path, exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"checkpoint.dir: the disk holding {target.parent} is full ({exc.strerror}) while writing {target.name}; "
            "free space or give the volume more (the incomplete file was removed, the last complete checkpoint stays)"
        )
    return f"checkpoint.dir: cannot write {target} ({exc.strerror or exc})"


class AtomicCheckpointIO(_AtomicCheckpointIOBehaviour, TorchCheckpointIO):
    __doc__ = _AtomicCheckpointIOBehaviour.__doc__


@functools.cache
def atomic_checkpoint_io_class(package: str) -> type:
    """AtomicCheckpointIO on `package`'s TorchCheckpointIO (lightning.pytorch or pytorch_lightning)."""
    if package == flavor.LIGHTNING:
        return AtomicCheckpointIO
    base = flavor.flavor(package).plugins.TorchCheckpointIO
    return type("AtomicCheckpointIO", (_AtomicCheckpointIOBehaviour, base), {"__module__": __name__})


def check_writable(location: str | os.PathLike[str], field: str) -> None:
    """`location` exists (created if need be) and takes a file, or a ConfigError naming `field`.

    Checked before training, so that a volume mounted read-only or owned by another user, or a
    bucket that cannot be reached, fails the job in its first seconds rather than at the first checkpoint.
    """
    if is_object_url(str(location)):
        object_store.check_writable(str(location), field)
        return
    directory = Path(location)
    probe = directory / object_store.write_probe_name()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"{field} {directory} is not writable ({exc.strerror or exc}); mount a writable volume there "
            "(spec.storage), or fix its owner (the trainer runs as uid "
            f"{contract.WORKLOAD_UID}, the pod's fsGroup)"
        ) from None


def _is_complete(path: Path) -> bool:
    try:
        return path.stat().st_size > 0 and zipfile.is_zipfile(path)
    except OSError:
        return False


def find_resume_checkpoint(location: str | os.PathLike[str]) -> str | Path | None:
    """The checkpoint a start resumes from; None for a fresh start.

    On object storage, the one `last.json` names. On a file system, last.ckpt, unless a newer step
    file exists: only when the writer died between the two files of one save. Incomplete files are
    skipped with a warning.
    """
    if is_object_url(str(location)):
        return checkpoint_store.find_object_checkpoint(str(location))
    return _find_file_checkpoint(Path(location))


def _find_file_checkpoint(directory: Path) -> Path | None:
    if not directory.is_dir():
        return None
    candidates = [p for p in directory.iterdir() if p.name == LAST_CHECKPOINT or STEP_FILE_PATTERN.match(p.name)]
    usable = []
    for path in candidates:
        if _is_complete(path):
            usable.append(path)
        else:
            log.warning("checkpoint %s is incomplete or unreadable; not resuming from it", path)
    if not usable:
        return None
    # Newest first; on equal times last.ckpt wins, as it is written after the step file.
    return max(usable, key=lambda p: (p.stat().st_mtime_ns, p.name == LAST_CHECKPOINT))
