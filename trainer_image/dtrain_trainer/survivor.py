"""No step lost when one rank dies: the ranks that outlive it save the last completed step before they exit.

DDP ranks are replicas. After every optimizer step each rank holds the whole model, optimizer
and LR-scheduler state, and every rank is at the same global step of the same data order. So
when a collective fails because a peer died (gloo: "Connection closed by peer", "Connection
reset by peer"; NCCL: a remote error raised by its async error handling), any survivor can write
the checkpoint the step grid would have written at the last completed step, and the restarted
gang resumes from it instead of from the last checkpoint of the grid ("just-in-time
checkpointing", Gupta et al., EuroSys 2024).

Never a half-applied step. The model and optimizer are those of the last completed step for as
long as no update is applied after it: a failure in the forward, in the gradient all-reduce of the
backward (it runs inside the optimizer's closure, before the update) or in any collective after the
step (stopping, stragglers) leaves them so; with gradient accumulation the micro-batches before the
last one have no collective at all, and the update waits for the last. What moved on since the step
is Lightning's loop counters, the resumable data loader's position (a micro-batch or the next
batch was fetched) and the buffers a forward updates (BatchNorm's running statistics):
`SurvivorCheckpoint`, the first callback, takes a copy of the loops' state (counters and loader
position, a few numbers) and of the model's saved buffers at each step boundary, at the moment a step
checkpoint would be saved, and the survivor's checkpoint carries those copies. Parameters are watched
by torch's version counters: when one changed after the boundary (an update was applied: a collective
in the user's own optimizer_step hook, after the update) it writes nothing, rather than a mixture.

Which survivor writes. The survivors cannot agree over the broken collective, and the error does not
say which peer died (gloo names an address, not a rank). Each survivor names itself in checkpoint.dir
with a small claim file (its rank and the step it holds), waits until every other rank could have
claimed (at once when all world_size - 1 have; at most CLAIM_SETTLE_SECONDS), and the writer is the
claim with the highest step, then the lowest rank: the lowest surviving rank, unless a rank finished
one step more before the failure reached it. The choice only saves work: correctness never depends
on it, since every survivor holds the same state of its step and the checkpoint writer is atomic (a
temporary file renamed into place; on object storage an upload that exists once whole, then the
pointer), so two survivors that both write leave one whole checkpoint. A new gang clears the claims.

The survivor then re-raises the collective's error: it exits non-zero as before, and the gang
restart happens as today, from the checkpoint it wrote (the newest).
"""

from __future__ import annotations

import copy
import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch

from dtrain_common import object_store
from dtrain_operator.api import SurvivorMark, contract
from dtrain_operator.api.storage import is_object_url
from dtrain_trainer import flavor

log = logging.getLogger("dtrain_trainer")

CLAIM_PREFIX = contract.SURVIVOR_CLAIM_PREFIX
CLAIM_PATTERN = re.compile(re.escape(CLAIM_PREFIX) + r"step=(\d+)\.rank=(\d+)$")
# How long a survivor waits for the other survivors' claims: they see the loss within moments of each other.
CLAIM_SETTLE_SECONDS = 2.0
CLAIM_POLL_SECONDS = 0.05
ERROR_MARK_CHARS = 300

# What gloo, NCCL and torch's stores say when the other end of a collective went away. A timeout is not
# among them: a peer that hangs is alive, and the progress deadline handles it.
PEER_LOSS_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote process exited",
    "ncclremoteerror",
    "nccl communicator was aborted",
)


def is_peer_loss(error: BaseException) -> bool:
    """Whether `error` (or an error it was raised from) is a collective failing because a peer went away."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RuntimeError):  # torch's DistBackendError and DistNetworkError are RuntimeErrors
            text = str(current).lower()
            if any(marker in text for marker in PEER_LOSS_MARKERS):
                return True
        current = current.__cause__ or current.__context__
    return False


def error_mark(error: BaseException) -> str:
    """The error's first line, shortened: what the checkpoint's mark keeps of it."""
    lines = str(error).strip().splitlines()
    first = lines[0] if lines else type(error).__name__
    return first if len(first) <= ERROR_MARK_CHARS else first[: ERROR_MARK_CHARS - 3] + "..."


@dataclass(frozen=True)
class StepSnapshot:
    """What moves on after an optimizer step without an update: the loops' state at that step's end, and the
    model's saved buffers (a forward changes BatchNorm's running statistics) as they were then."""

    step: int
    epoch: int
    loops: dict[str, Any]
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


class StepTracker:
    """The state of the last completed optimizer step that the live one no longer holds; `batch_ended` is told
    after every batch.

    With gradient accumulation a batch that only accumulates leaves the global step as it was: not a step
    boundary, the snapshot stays that of the last completed update. The parameters are watched by their
    version counters (torch bumps them at every in-place change, the optimizer's too): one changed since the
    boundary means an update was applied, and the step is not savable. The buffers saved in a checkpoint are
    copied at every boundary: the next forward changes some of them (BatchNorm's running statistics, which
    its kernel updates without bumping a version), and they are saved as they were at the boundary. They are
    small beside the parameters; buffers registered with persistent=False are not saved, nor copied.
    """

    def __init__(self, start_step: int, module: torch.nn.Module) -> None:
        self.last_step = start_step
        self.snapshot: StepSnapshot | None = None
        self._module = module
        saved = module.state_dict(keep_vars=True).keys()
        self._buffer_names = [name for name, _ in module.named_buffers() if name in saved]
        self._parameter_versions = _versions(module.named_parameters())

    def batch_ended(self, step: int, epoch: int, loops_state: Callable[[], dict[str, Any]]) -> None:
        if step == self.last_step:
            return
        self.last_step = step
        buffers = dict(self._module.named_buffers())
        copies = {name: buffers[name].detach().clone() for name in self._buffer_names if name in buffers}
        self._parameter_versions = _versions(self._module.named_parameters())
        self.snapshot = StepSnapshot(step, epoch, copy.deepcopy(loops_state()), copies)

    def savable(self, live_step: int, saved_step: int | None) -> tuple[StepSnapshot | None, str]:
        """The state to save now that the live one is at `live_step` (its `buffers` replace the model's in the
        checkpoint), or None and why not."""
        snapshot = self.snapshot
        if snapshot is None:
            return None, "no optimizer step completed since this gang started"
        updated = [name for name, p in self._module.named_parameters() if p._version != self._parameter_versions.get(name)]
        if live_step != snapshot.step or updated:
            return None, (f"an update was applied after step {snapshot.step} (parameter {(updated or ['?'])[0]} changed), "
                          "and the loop state of the step it belongs to is not known")
        if saved_step == snapshot.step:
            return None, f"step {snapshot.step} is saved already"
        return snapshot, ""


def _versions(tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, int]:
    return {name: tensor._version for name, tensor in tensors}


@dataclass(frozen=True, order=True)
class Claim:
    step: int
    rank: int

    @property
    def name(self) -> str:
        return f"{CLAIM_PREFIX}step={self.step}.rank={self.rank}"


def parse_claim(name: str) -> Claim | None:
    match = CLAIM_PATTERN.match(name)
    return Claim(int(match.group(1)), int(match.group(2))) if match else None


def choose_writer(claims: Iterable[Claim]) -> Claim | None:
    """The survivor that writes: the newest step any survivor holds, and of those who hold it the lowest rank."""
    return min(claims, key=lambda claim: (-claim.step, claim.rank), default=None)


class ClaimBoard:
    """The survivors' claims in checkpoint.dir (a directory, or s3:// and gs://)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.remote = is_object_url(directory)

    def post(self, claim: Claim) -> None:
        if self.remote:
            object_store.put_bytes(object_store.join(self.directory, claim.name), b"")
            return
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        (Path(self.directory) / claim.name).touch()

    def claims(self) -> list[Claim]:
        if self.remote:
            names = object_store.list_names(self.directory)
        else:
            try:
                names = os.listdir(self.directory)
            except OSError:
                names = []
        return [claim for claim in map(parse_claim, names) if claim is not None]

    def clear(self) -> None:
        for claim in self.claims():
            if self.remote:
                object_store.remove(object_store.join(self.directory, claim.name))
            else:
                (Path(self.directory) / claim.name).unlink(missing_ok=True)

    def elect(self, own: Claim, expected: int, settle_seconds: float = CLAIM_SETTLE_SECONDS) -> Claim:
        """Post `own`, wait for up to `expected` claims (every rank but the lost one), and return the writer."""
        self.post(own)
        deadline = time.monotonic() + settle_seconds
        claims = self.claims()
        while len(claims) < expected and time.monotonic() < deadline:
            time.sleep(CLAIM_POLL_SECONDS)
            claims = self.claims()
        return choose_writer([*claims, own]) or own


class _SurvivorCheckpointBehaviour:
    """Keeps the last completed step's loop state; when a peer is lost, the chosen survivor saves that step.

    It must be the first callback: at a step's end its copy is taken before any other callback
    runs a collective that could fail.
    """

    def __init__(self, settle_seconds: float = CLAIM_SETTLE_SECONDS) -> None:
        super().__init__()
        self.settle_seconds = settle_seconds
        self.tracker: StepTracker | None = None
        # The mark of the checkpoint this rank saved as a survivor (None: it saved none).
        self.saved: SurvivorMark | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.tracker = StepTracker(trainer.global_step, pl_module)
        if trainer.is_global_zero:
            # Claims of an earlier gang: a writer that died before clearing them must not win this gang's choice.
            ClaimBoard(str(_checkpoint_callback(trainer).dirpath)).clear()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.tracker is not None and trainer.world_size > 1:
            self.tracker.batch_ended(trainer.global_step, trainer.current_epoch, trainer._checkpoint_connector._get_loops_state_dict)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self.tracker is None or trainer.world_size < 2 or not is_peer_loss(exception):
            return
        try:
            self._save(trainer, exception)
        except Exception:  # the collective's own error is what the rank exits with
            log.exception("rank %d: the checkpoint of the last completed step could not be saved", trainer.global_rank)

    def _save(self, trainer: L.Trainer, exception: BaseException) -> None:
        assert self.tracker is not None
        rank = trainer.global_rank
        checkpoint_callback = _checkpoint_callback(trainer)
        snapshot, why_not = self.tracker.savable(trainer.global_step, checkpoint_callback.saved_step)
        if snapshot is None:
            log.warning("rank %d outlived a lost peer (%s); no checkpoint to save: %s", rank, error_mark(exception), why_not)
            return
        board = ClaimBoard(str(checkpoint_callback.dirpath))
        writer = board.elect(Claim(snapshot.step, rank), expected=trainer.world_size - 1, settle_seconds=self.settle_seconds)
        if writer.rank != rank:
            log.warning("rank %d outlived a lost peer; rank %d saves step %d", rank, writer.rank, writer.step)
            return
        mark = SurvivorMark(rank=rank, step=snapshot.step, error=error_mark(exception))
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        checkpoint.update(epoch=snapshot.epoch, global_step=snapshot.step, loops=snapshot.loops)
        checkpoint["state_dict"].update({name: value for name, value in snapshot.buffers.items() if name in checkpoint["state_dict"]})
        checkpoint[contract.CHECKPOINT_SURVIVOR_KEY] = mark.to_wire()
        path = checkpoint_callback.save_alone(trainer, checkpoint, snapshot.step, mark)
        board.clear()
        self.saved = mark
        log.warning(
            "checkpoint of step %d saved by surviving rank %d after a peer was lost (%s): %s",
            snapshot.step, rank, mark.error, path,
        )


def _checkpoint_callback(trainer: L.Trainer) -> Any:
    """The step-checkpoint callback (dtrain_trainer.checkpointing), which knows where and how a step is saved."""
    return next(c for c in trainer.callbacks if callable(getattr(c, "save_alone", None)))  # type: ignore[attr-defined]


class SurvivorCheckpoint(_SurvivorCheckpointBehaviour, L.Callback):
    __doc__ = _SurvivorCheckpointBehaviour.__doc__


def survivor_checkpoint_class(package: str) -> type:
    """SurvivorCheckpoint on `package`'s Callback (lightning.pytorch or pytorch_lightning)."""
    return flavor.callback_class(package, _SurvivorCheckpointBehaviour, SurvivorCheckpoint)
