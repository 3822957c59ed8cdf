"""The Trainer that `run` builds: every setting of the config reaches Lightning."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
from lightning.pytorch.strategies import DDPStrategy

from dtrain_operator.api import TrainerConfig
from dtrain_trainer.checkpointing import StepCheckpoint
from dtrain_trainer.progress import ProgressReporter
from dtrain_trainer.progress_callback import ProgressCallback
from dtrain_trainer.runner import build_trainer

from .conftest import ListSink, trainer_config


def test_settings_reach_lightning(tmp_path: Path) -> None:
    config = TrainerConfig.model_validate(
        trainer_config(
            tmp_path,
            trainer={
                "gradientClipVal": 0.5,
                "gradientClipAlgorithm": "value",
                "accumulateGradBatches": 4,
                "maxSteps": 100,
                "maxEpochs": 3,
                "logEveryNSteps": 7,
                "limitTrainBatches": 0.25,
                "findUnusedParameters": True,
            },
            nccl={"timeoutSeconds": 120},
            checkpoint={"everyNSteps": 25, "keepLast": 5},
        )
    )
    trainer = build_trainer(config)
    assert trainer.gradient_clip_val == 0.5
    assert str(trainer.gradient_clip_algorithm.value) == "value"
    assert trainer.accumulate_grad_batches == 4
    assert (trainer.max_steps, trainer.max_epochs) == (100, 3)
    assert trainer.log_every_n_steps == 7
    assert trainer.limit_train_batches == 0.25
    assert trainer.precision == "32-true"
    assert trainer.progress_bar_callback is None

    strategy = trainer.strategy
    assert isinstance(strategy, DDPStrategy)
    assert strategy._timeout == timedelta(seconds=120)
    assert strategy._process_group_backend == "gloo"
    assert strategy._ddp_kwargs["find_unused_parameters"] is True
    assert (strategy.num_nodes, strategy.num_processes) == (1, 1)

    checkpoint = next(c for c in trainer.callbacks if isinstance(c, StepCheckpoint))
    assert checkpoint.dirpath == str(tmp_path / "checkpoints")
    assert (checkpoint._every_n_train_steps, checkpoint.save_top_k, checkpoint.save_last) == (25, 5, True)
    assert (checkpoint.monitor, checkpoint.mode) == ("step", "max")
    assert any(isinstance(c, ProgressCallback) for c in trainer.callbacks)


def test_16_mixed_on_cpu_falls_back_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = TrainerConfig.model_validate(trainer_config(tmp_path, trainer={"precision": "16-mixed"}))
    sink = ListSink()
    with caplog.at_level(logging.WARNING, logger="dtrain_trainer"):
        trainer = build_trainer(config, ProgressReporter(sink, interval_seconds=0.0))
    assert trainer.precision == "32-true"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "16-mixed needs a CUDA GPU" in warnings[0]
    assert [r["event"] for r in sink.records] == ["warning"]


def test_bf16_mixed_stays_on_cpu(tmp_path: Path) -> None:
    config = TrainerConfig.model_validate(trainer_config(tmp_path, trainer={"precision": "bf16-mixed"}))
    assert build_trainer(config).precision == "bf16-mixed"
