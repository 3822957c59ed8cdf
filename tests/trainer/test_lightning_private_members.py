"""The private members of Lightning that dtrain relies on are there, as it uses them.

Lightning's public API has no way to save the current step on demand (at the end of training,
or when asked) nor to be told the path of each file saved, so StepCheckpoint
(dtrain_trainer.checkpointing) calls and overrides these. They may change in any minor
release: pyproject.toml pins lightning and pytorch-lightning to the minors checked here, and
this test names the member that a newer Lightning changed, before a job finds out. The same
holds for the fit loop's members that LoaderPosition (dtrain_trainer.resumable) uses, where
Lightning keeps a checkpoint's loader states aside, and for its restart stages that EpochAfterRestart reads.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from dtrain_trainer import flavor

# member -> the parameters (after self) that StepCheckpoint passes or receives
PRIVATE_METHODS = {
    "_save_checkpoint": ("trainer", "filepath"),  # overridden: every file written goes through it
    "_monitor_candidates": ("trainer",),  # called by save_now
    "_save_topk_checkpoint": ("trainer", "monitor_candidates"),  # called by save_now: the step file
    "_save_last_checkpoint": ("trainer", "monitor_candidates"),  # called by save_now: last.ckpt
}
# Set at train start to the resumed step, read by save_now; Lightning's own skip checks read it too.
LAST_SAVED_STEP = "_last_global_step_saved"


@pytest.fixture(params=flavor.PACKAGES)
def model_checkpoint(request: pytest.FixtureRequest) -> type:
    return flavor.flavor(request.param).callbacks.ModelCheckpoint


@pytest.mark.parametrize("member", sorted(PRIVATE_METHODS))
def test_the_private_methods_step_checkpoint_uses_take_what_it_passes(model_checkpoint: type, member: str) -> None:
    where = f"{model_checkpoint.__module__}.{model_checkpoint.__qualname__}"
    method = getattr(model_checkpoint, member, None)
    assert callable(method), (
        f"{where} has no method {member}, which dtrain_trainer.checkpointing.StepCheckpoint uses: "
        "this Lightning is newer than the range pinned in pyproject.toml; adapt StepCheckpoint"
    )
    parameters = tuple(inspect.signature(method).parameters)[1:]
    assert parameters == PRIVATE_METHODS[member], (
        f"{where}.{member} takes {parameters}, StepCheckpoint passes {PRIVATE_METHODS[member]}: "
        "this Lightning is newer than the range pinned in pyproject.toml; adapt StepCheckpoint"
    )


def test_the_last_saved_step_is_an_attribute_lightnings_skip_check_reads(model_checkpoint: type, tmp_path: Path) -> None:
    where = f"{model_checkpoint.__module__}.{model_checkpoint.__qualname__}"
    assert isinstance(getattr(model_checkpoint(dirpath=str(tmp_path)), LAST_SAVED_STEP, None), int), (
        f"{where} has no int attribute {LAST_SAVED_STEP}, which StepCheckpoint sets and reads: "
        "this Lightning is newer than the range pinned in pyproject.toml; adapt StepCheckpoint"
    )
    skip_check = inspect.getsource(model_checkpoint._should_skip_saving_checkpoint)
    assert LAST_SAVED_STEP in skip_check, (
        f"{where}._should_skip_saving_checkpoint no longer reads {LAST_SAVED_STEP}: setting it at train start "
        "would not stop a resumed run rewriting its own checkpoint; adapt StepCheckpoint"
    )


# What a survivor of a lost peer (dtrain_trainer.survivor) reads, with no collective: the loops' state at each
# step's end, and the whole checkpoint of the live state (which it then corrects to the last completed step).
CHECKPOINT_CONNECTOR_METHODS = {"_get_loops_state_dict": (), "dump_checkpoint": ("weights_only",)}
# ModelCheckpoint's top-k bookkeeping, which StepCheckpoint.save_alone keeps as Lightning's own save would.
TOP_K_ATTRIBUTES = ("best_k_models", "kth_best_model_path", "kth_value", "best_model_path", "best_model_score",
                    "current_score", "last_model_path", "save_top_k")


@pytest.mark.parametrize("package", flavor.PACKAGES)
def test_the_checkpoint_connector_has_what_a_survivor_calls(package: str) -> None:
    pl = flavor.flavor(package)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    connector = getattr(trainer, "_checkpoint_connector", None)
    for member, expected in CHECKPOINT_CONNECTOR_METHODS.items():
        method = getattr(connector, member, None)
        assert callable(method), (
            f"{package}'s Trainer._checkpoint_connector has no {member}, which dtrain_trainer.survivor calls: "
            "this Lightning is newer than the range pinned in pyproject.toml; adapt the survivor's checkpoint"
        )
        assert tuple(inspect.signature(method).parameters) == expected, f"{package}: {member} takes other parameters"


def test_the_top_k_bookkeeping_save_alone_keeps_is_there(model_checkpoint: type, tmp_path: Path) -> None:
    callback = model_checkpoint(dirpath=str(tmp_path), monitor="step", mode="max", save_top_k=1)
    missing = [name for name in TOP_K_ATTRIBUTES if not hasattr(callback, name)]
    assert not missing, f"{model_checkpoint.__qualname__} has no {missing}, which StepCheckpoint.save_alone keeps"
    assert set(callback.state_dict()) >= {"best_k_models", "kth_best_model_path", "last_model_path"}


# The fit loop's members that LoaderPosition (dtrain_trainer.resumable) reads and calls: where Lightning keeps
# a checkpoint's loader states aside until it builds the training loader, the load, and the data fetcher.
FIT_LOOP_MEMBERS = ("_combined_loader_states_to_load", "_data_fetcher", "_load_combined_loader_states")


@pytest.mark.parametrize("package", flavor.PACKAGES)
def test_the_fit_loop_keeps_a_checkpoints_loader_states_where_loader_position_finds_them(package: str) -> None:
    pl = flavor.flavor(package)
    fit_loop = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False).fit_loop
    where = f"{type(fit_loop).__module__}.{type(fit_loop).__qualname__}"
    for member in FIT_LOOP_MEMBERS:
        assert hasattr(fit_loop, member), (
            f"{where} has no {member}, which dtrain_trainer.resumable.LoaderPosition uses: "
            "this Lightning is newer than the range pinned in pyproject.toml; adapt LoaderPosition"
        )
    fit_loop.on_load_checkpoint({"combined_loader": [{"position": 3}]})
    assert fit_loop._combined_loader_states_to_load == [{"position": 3}], (
        f"{where}.on_load_checkpoint no longer keeps the loader states in _combined_loader_states_to_load: "
        "adapt dtrain_trainer.resumable.LoaderPosition"
    )


# What EpochAfterRestart (dtrain_trainer.resumable) reads of a restart and clears: the fit loop's stage, the
# epoch loop's, and whether the saved micro-batch was its epoch's last.
FIT_LOOP_RESTART_MEMBERS = ("restarted_mid_epoch", "reset_restart_stage")
EPOCH_LOOP_RESTART_MEMBERS = ("restarted_on_train_batch_end",)


@pytest.mark.parametrize("package", flavor.PACKAGES)
def test_the_loops_have_the_restart_stages_epoch_after_restart_reads(package: str) -> None:
    pl = flavor.flavor(package)
    fit_loop = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False).fit_loop
    where = f"{type(fit_loop).__module__}.{type(fit_loop).__qualname__}"
    missing = [name for name in FIT_LOOP_RESTART_MEMBERS if not hasattr(fit_loop, name)]
    missing += [f"epoch_loop.{name}" for name in EPOCH_LOOP_RESTART_MEMBERS if not hasattr(fit_loop.epoch_loop, name)]
    if not hasattr(fit_loop.epoch_loop.batch_progress, "is_last_batch"):
        missing.append("epoch_loop.batch_progress.is_last_batch")
    assert not missing, (
        f"{where} has no {missing}, which dtrain_trainer.resumable.EpochAfterRestart uses: "
        "this Lightning is newer than the range pinned in pyproject.toml; adapt EpochAfterRestart"
    )
    assert fit_loop.restarted_mid_epoch is False
    fit_loop.reset_restart_stage()
