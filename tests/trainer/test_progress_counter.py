"""Rank 0's batch counter: only training and validation batches advance it; a checkpoint write says so."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from dtrain_operator.api import contract
from dtrain_operator.api.records import status_patch
from dtrain_trainer.progress import ProgressReporter
from dtrain_trainer.progress_callback import ProgressCallback

from .conftest import ListSink


def fake_trainer(step: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        is_global_zero=True, global_step=step, current_epoch=0, accumulate_grad_batches=1, world_size=2,
        estimated_stepping_batches=100, ckpt_path=None, progress_bar_metrics={}, callback_metrics={},
    )


def progress_records(sink: ListSink) -> list[dict]:
    return [r for r in sink.records if r["event"] == "progress"]


def test_the_counter_moves_with_batches_and_a_save_is_a_stage_of_its_own() -> None:
    sink = ListSink()
    # An interval longer than the test: only forced records (a stage change) are sent after the first.
    callback = ProgressCallback(ProgressReporter(sink, interval_seconds=3600), default_batch_size=4)
    trainer = fake_trainer()
    callback.on_train_start(trainer, None)
    batch = (torch.zeros(4, 3), torch.zeros(4))
    callback.on_train_batch_end(trainer, None, torch.tensor(1.0), batch, 0)
    first = progress_records(sink)[-1]
    assert (first["batches"], first["stage"]) == (1, contract.PROGRESS_STAGE_TRAINING)
    assert first["batchTime"]
    callback.on_train_batch_end(trainer, None, torch.tensor(1.0), batch, 1)
    assert len(progress_records(sink)) == 1  # rate-limited, and the counter moved on regardless
    assert callback.batches == 2

    callback.checkpoint_writing(True)
    saving = progress_records(sink)[-1]
    assert (saving["stage"], saving["batches"]) == (contract.PROGRESS_STAGE_CHECKPOINTING, 2)
    # The end of the write is said at once: a rank that then blocks in the next all-reduce leaves
    # "training" in the status, and the deadline runs from the end of the write.
    callback.checkpoint_writing(False)
    written = progress_records(sink)[-1]
    assert (written["stage"], written["batches"]) == (contract.PROGRESS_STAGE_TRAINING, 2)
    callback.on_train_batch_end(trainer, None, torch.tensor(1.0), batch, 2)
    assert callback.batches == 3 and progress_records(sink)[-1] is written  # rate-limited again

    callback.on_validation_batch_end(trainer, None, None, batch, 0)
    validating = progress_records(sink)[-1]
    assert (validating["stage"], validating["batches"]) == (contract.PROGRESS_STAGE_VALIDATING, 4)
    patch = status_patch(validating)
    assert patch is not None
    assert patch["progress"]["batches"] == 4 and patch["progress"]["batchTime"] == validating["batchTime"]


def test_other_ranks_send_nothing() -> None:
    sink = ListSink()
    callback = ProgressCallback(ProgressReporter(sink, interval_seconds=0), default_batch_size=4)
    trainer = fake_trainer()
    trainer.is_global_zero = False
    callback.on_train_start(trainer, None)
    callback.on_train_batch_end(trainer, None, torch.tensor(1.0), (torch.zeros(4, 3),), 0)
    callback.on_validation_batch_end(trainer, None, None, (torch.zeros(4, 3),), 0)
    callback.checkpoint_writing(True)
    callback.checkpoint_writing(False)
    assert sink.records == []
