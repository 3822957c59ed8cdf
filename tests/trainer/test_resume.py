"""A gang restart from a mid-epoch checkpoint ends with the weights of a run that was never interrupted.

The data order continues exactly where the checkpoint left it: no batch of the epoch is
trained twice and none is skipped, for a user's DataLoader over a map-style dataset and
for the built-in data modules, also when the model asks Lightning for the run's length
before the checkpoint is restored (a cosine schedule).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from dtrain_operator.api import contract
from dtrain_operator.core.render import TRAINER_COMMAND

from ..ports import free_port
from .conftest import RUN_TIMEOUT_SECONDS, USER_MODEL, process_env, trainer_config, write_config
from .user_code.dtrain_test_user import CRASH_EXIT_CODE

pytestmark = pytest.mark.slow

SYNTHETIC = {"classPath": "SyntheticImageDataModule", "initArgs": {"image_size": 16, "num_classes": 4, "num_samples": 128, "pool_size": 128}}


def launch(
    tmp_path: Path, config: dict[str, Any], processes: int, name: str, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """The pod's command (the launcher and torchrun) on one node of `processes` ranks."""
    env = process_env(
        **extra_env,
        **{
            contract.ENV_CONFIG: str(write_config(tmp_path, config, f"{name}.yaml")),
            contract.ENV_NNODES: "1",
            contract.ENV_NPROC_PER_NODE: str(processes),
            contract.ENV_NODE_RANK: "0",
            contract.ENV_MASTER_ADDR: "127.0.0.1",
            contract.ENV_MASTER_PORT: str(free_port()),
            contract.ENV_PROGRESS_SINK: "none",
        }
    )
    return subprocess.run(
        [sys.executable, *TRAINER_COMMAND[1:]], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS,
        check=False,
    )


def final_weights(checkpoints: Path) -> dict[str, torch.Tensor]:
    checkpoint = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 12
    return checkpoint["state_dict"]


def saved_step(checkpoints: Path) -> int:
    return int(torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=False)["global_step"])


def assert_same_weights(resumed: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert expected.keys() == resumed.keys()
    for name, weight in expected.items():
        torch.testing.assert_close(resumed[name], weight, rtol=1e-5, atol=1e-6, msg=name)


def assert_resumes_exactly(
    tmp_path: Path, config: Callable[..., dict[str, Any]], processes: int, crashes: list[int]
) -> None:
    """`config("whole")` run through, and `config("restarted", crash_at_step=crashes, ...)` restarted after a
    worker died at each of `crashes` (right after that step's checkpoint), end with the same weights."""
    whole = launch(tmp_path, config("whole"), processes, "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    crashing = config("restarted", crash_at_step=crashes, crash_marker=str(tmp_path / "crashed"))
    for step in crashes:
        crashed = launch(tmp_path, crashing, processes, "restarted")
        assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr[-3000:]
        assert saved_step(tmp_path / "restarted" / "checkpoints") == step
    finished = launch(tmp_path, crashing, processes, "restarted")
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "resumed from" in finished.stderr
    assert "not resumable" not in finished.stderr and "not fully resumable" not in finished.stderr
    assert_same_weights(final_weights(tmp_path / "restarted" / "checkpoints"), final_weights(tmp_path / "whole" / "checkpoints"))


@pytest.mark.parametrize(
    ("data", "processes"),
    [({"initArgs": {"num_samples": 128}}, 2), (SYNTHETIC, 1)],
    ids=["users-dataloader-two-ranks", "builtin-data-module"],
)
def test_resuming_mid_epoch_ends_with_the_uninterrupted_runs_weights(
    tmp_path: Path, data: dict[str, Any], processes: int
) -> None:
    def config(run: str, **model_args: Any) -> dict[str, Any]:
        # 128 samples in batches of 8 per rank: an epoch of 16 / processes steps; 12 steps cross an epoch end.
        return trainer_config(
            tmp_path / run,
            model={"classPath": USER_MODEL, "initArgs": model_args},
            data=data,
            trainer={"maxSteps": 12, "maxEpochs": 5, "numWorkers": 0},
            checkpoint={"everyNSteps": 3, "keepLast": 1},
            export={"onnx": {"enabled": False}},
        )

    whole = launch(tmp_path, config("whole"), processes, "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]

    # A worker dies right after the checkpoint of step 6, mid-epoch; the restarted gang resumes from it.
    crashing = config("restarted", crash_at_step=6, crash_marker=str(tmp_path / "crashed-once"))
    first = launch(tmp_path, crashing, processes, "restarted")
    assert first.returncode == CRASH_EXIT_CODE, first.stderr[-3000:]
    assert torch.load(tmp_path / "restarted" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 6
    second = launch(tmp_path, crashing, processes, "restarted")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr
    assert "not resumable" not in second.stderr and "not fully resumable" not in second.stderr

    expected, resumed = final_weights(tmp_path / "whole" / "checkpoints"), final_weights(tmp_path / "restarted" / "checkpoints")
    assert_same_weights(resumed, expected)


def test_the_cosine_schedule_resumed_in_any_epoch_ends_with_the_uninterrupted_runs_weights(tmp_path: Path) -> None:
    """`lr_schedule: cosine` (the quick start's) asks Lightning for the run's length in configure_optimizers,
    which builds the training loader before the checkpoint is restored; Lightning then kept the loader position
    of the checkpoint aside and never gave it to the loader, so a resumed epoch started over from its first batch."""
    def config(run: str, **crash: Any) -> dict[str, Any]:
        # 128 samples in batches of 8 on each of 2 ranks: epochs of 8 steps; resumed at 6 and at 10, in the second.
        return trainer_config(
            tmp_path / run,
            model={"classPath": "dtrain_test_user.CrashingImageClassifier",
                   "initArgs": {"arch": "shufflenet_v2_x0_5", "num_classes": 4, "optimizer": "sgd", "lr": 0.05,
                                "lr_schedule": "cosine", **crash}},
            data={"initArgs": {"num_samples": 128, "image_size": 32}},
            trainer={"maxSteps": 12, "maxEpochs": 5, "numWorkers": 0},
            checkpoint={"everyNSteps": 2, "keepLast": 1},
            export={"onnx": {"enabled": False}},
        )

    assert_resumes_exactly(tmp_path, config, processes=2, crashes=[6, 10])



# Epochs of 4 steps (32 samples in batches of 8 over the ranks), 3 of them: resumed at 4 and at 8, two epoch ends
# in a row, the run's end decided by maxEpochs.
EPOCH_END_DATA = {
    "users-dataloader-two-ranks": ({"initArgs": {"num_samples": 64}}, 2),
    "builtin-data-module": ({"classPath": "SyntheticImageDataModule",
                             "initArgs": {"image_size": 16, "num_classes": 4, "num_samples": 32, "pool_size": 32}}, 1),
}


@pytest.mark.parametrize(("data", "processes"), EPOCH_END_DATA.values(), ids=EPOCH_END_DATA.keys())
def test_resuming_from_epoch_ends_trains_each_epoch_once(tmp_path: Path, data: dict[str, Any], processes: int) -> None:
    """A checkpoint of an epoch's last step holds a loader that has yielded every batch of its epoch: resumed,
    the next epoch must start from its first batch, not be skipped as an exhausted one. And resumed from such a
    checkpoint twice in a row, the epoch between is not trained again (Lightning took it for the restarted one:
    dtrain_trainer.resumable.EpochAfterRestart)."""
    def config(run: str, **model_args: Any) -> dict[str, Any]:
        return trainer_config(
            tmp_path / run,
            model={"classPath": USER_MODEL, "initArgs": model_args},
            data=data,
            trainer={"maxSteps": -1, "maxEpochs": 3, "numWorkers": 0},
            checkpoint={"everyNSteps": 2, "keepLast": 1},
            export={"onnx": {"enabled": False}},
        )

    assert_resumes_exactly(tmp_path, config, processes=processes, crashes=[4, 8])
