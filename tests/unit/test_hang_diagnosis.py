"""Where a hang sits: the comparison of every rank's stacks (core.hang_diagnosis), and what it agrees on with the
trainer (api.stacks, the hang record)."""

from __future__ import annotations

from typing import Any

import pytest

from dtrain_operator.api import HangStacks, Progress, StackGroup, records
from dtrain_operator.api.stacks import format_ranks, is_framework, parse_ranks
from dtrain_operator.core import hang_diagnosis
from dtrain_operator.core.policy import FailureDecision


def frame(module: str, function: str, line: int = 1) -> dict[str, Any]:
    return {"module": module, "function": function, "file": f"{module.rsplit('.', 1)[-1]}.py", "line": line}


RUNNER = frame("dtrain_trainer.runner", "_fit", 326)
# What the training threads stood in, innermost first, as the trainer summarizes them (frames, then code).
BACKWARD = [frame("torch.autograd.graph", "_engine_run_backward"), frame("torch.autograd", "backward"),
            frame("lightning.pytorch.core.module", "LightningModule.backward")], [RUNNER]
IN_TRAINING_STEP = [frame("my_models", "Net.training_step", 52),
                    frame("lightning.pytorch.strategies.strategy", "wrapped_forward")], [frame("my_models", "Net.training_step", 52)]
IN_DATASET = [frame("my_data", "SlowSet.__getitem__", 17), frame("torch.utils.data._utils.fetch", "fetch"),
              frame("torch.utils.data.dataloader", "_next_data")], [frame("my_data", "SlowSet.__getitem__", 17)]
ALL_REDUCE = [frame("torch.distributed.distributed_c10d", "all_reduce"), frame("torch.distributed.c10d_logger", "wrapper"),
              frame("my_models", "Net.training_step", 60)], [frame("my_models", "Net.training_step", 60)]
BARRIER = [frame("torch.distributed.distributed_c10d", "barrier"),
           frame("lightning.fabric.utilities.distributed", "_barrier")], [RUNNER]


def stacks(*groups: tuple[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]], silent: str | None = None,
           world: int = 2, **fields: Any) -> HangStacks:
    return HangStacks.model_validate({
        "step": 3, "batches": 7, "worldSize": world, "silent": silent, "dumps": "/art/hangs/t-step-3",
        "groups": [{"ranks": ranks, "threads": 2, "frames": where[0], "code": where[1]} for ranks, where in groups],
        **fields,
    })


def where(rank: int) -> str:
    return f"pod job-{rank} on node n{rank}"


def test_a_rank_in_its_own_code_is_named_with_its_pod_node_and_frame_while_the_others_wait_for_it() -> None:
    diagnosis = hang_diagnosis.diagnose(stacks(("0", BACKWARD), ("1", IN_TRAINING_STEP)), 2, where)
    assert diagnosis.named == (1,)
    assert diagnosis.message == (
        "Where it hangs: rank 1 (pod job-1 on node n1) is in its own code at my_models.py:52 in Net.training_step - "
        "not where the others are: rank 0 is in the backward pass (DDP's gradient all-reduce) called from "
        "runner.py:326 in _fit. Every rank's stacks: /art/hangs/t-step-3/stacks.txt"
    )


def test_a_rank_in_its_data_loader_is_named_at_the_dataset_code_it_runs() -> None:
    diagnosis = hang_diagnosis.diagnose(stacks(("0", BACKWARD), ("1", IN_DATASET)), 2, where)
    assert diagnosis.named == (1,)
    assert "rank 1 (pod job-1 on node n1) is in the data loader at my_data.py:17 in SlowSet.__getitem__" in diagnosis.message


def test_a_silent_rank_is_named_by_its_silence() -> None:
    diagnosis = hang_diagnosis.diagnose(stacks(("0", BACKWARD), silent="1"), 2, where)
    assert diagnosis.named == (1,)
    assert "rank 1 (pod job-1 on node n1) gave no stack: stopped (SIGSTOP)" in diagnosis.message
    assert "not where the others are: rank 0 is in the backward pass" in diagnosis.message
    # A rank the summary does not account for is as silent as one it names so.
    assert hang_diagnosis.diagnose(stacks(("0", BACKWARD)), 2, where).named == (1,)


def test_every_rank_in_one_collective_names_no_rank() -> None:
    diagnosis = hang_diagnosis.diagnose(stacks(("0-3", ALL_REDUCE), world=4), 4, where)
    assert diagnosis.named == ()
    assert diagnosis.message.startswith(
        "Where it hangs: every rank (0-3) stands at the same place, in a collective (torch.distributed.all_reduce) "
        "called from my_models.py:60 in Net.training_step: no rank differs"
    )


def test_ranks_in_another_collective_than_most_are_named_and_a_tie_names_every_place() -> None:
    fewer = hang_diagnosis.diagnose(stacks(("0,2-3", BARRIER), ("1", ALL_REDUCE), world=4), 4, where)
    assert fewer.named == (1,)
    assert "rank 1 (pod job-1 on node n1) is in a collective (torch.distributed.all_reduce)" in fewer.message
    assert "ranks 0,2-3 are in a collective (torch.distributed.barrier) called from runner.py:326 in _fit" in fewer.message
    tie = hang_diagnosis.diagnose(stacks(("0", BARRIER), ("1", ALL_REDUCE)), 2, where)
    assert tie.named == (0, 1) and "each at a place of its own" in tie.message


def test_ddps_own_synchronisation_in_its_forward_is_a_collective() -> None:
    pre_forward = [frame("torch.nn.parallel.distributed", "DistributedDataParallel._pre_forward"),
                   frame("torch.nn.modules.module", "Module._call_impl")], [RUNNER]
    diagnosis = hang_diagnosis.diagnose(stacks(("0", pre_forward), ("1", IN_DATASET)), 2, where)
    assert diagnosis.named == (1,)
    assert "rank 0 is in a collective (DistributedDataParallel._pre_forward) called from runner.py:326" in diagnosis.message


def test_groups_that_differ_only_outside_the_summary_stand_at_one_place() -> None:
    other_caller = (BACKWARD[0], [RUNNER, frame("dtrain_trainer.runner", "run", 253)])
    diagnosis = hang_diagnosis.diagnose(stacks(("0", BACKWARD), ("1-2", other_caller), ("3", IN_TRAINING_STEP), world=4), 4, where)
    assert diagnosis.named == (3,)
    assert "ranks 0-2 are in the backward pass" in diagnosis.message


def test_many_named_ranks_are_counted_past_a_few() -> None:
    diagnosis = hang_diagnosis.diagnose(stacks(("0", BACKWARD), silent="1-20", world=21), 21, where)
    assert len(diagnosis.named) == 20
    assert "rank 8 (pod job-8 on node n8) and 12 more gave no stack" in diagnosis.message


def test_no_stacks_says_why_there_may_be_none() -> None:
    diagnosis = hang_diagnosis.diagnose(None, 2, where)
    assert diagnosis.named == () and "no rank's stacks arrived before the deadline" in diagnosis.message


def test_only_the_current_stalls_stacks_count() -> None:
    collected = stacks(("0-1", ALL_REDUCE), gangGeneration=2)
    assert hang_diagnosis.current_stacks(collected, Progress(batches=7), 2) is collected
    # An earlier gang's, or a stall the gang got past since (its batch counter moved on).
    assert hang_diagnosis.current_stacks(collected, Progress(batches=7), 3) is None
    assert hang_diagnosis.current_stacks(collected, Progress(batches=9), 2) is None
    # dtrain run reads its own records, unstamped.
    assert hang_diagnosis.current_stacks(stacks(("0-1", ALL_REDUCE)), Progress(batches=5), None) is not None


def test_the_decision_carries_the_diagnosis() -> None:
    decision = FailureDecision(True, "ProgressDeadlineExceeded", "no training batch for 31 s")
    diagnosis = hang_diagnosis.diagnose(stacks(("0", BACKWARD), silent="1"), 2, where)
    explained = hang_diagnosis.explained(decision, diagnosis)
    assert explained.restart and explained.reason == "ProgressDeadlineExceeded"
    assert explained.message == f"no training batch for 31 s. {diagnosis.message}"


def test_the_hang_record_reaches_the_status_whole_nulls_included() -> None:
    record = records.build_record(
        records.Event.HANG, time="t", step=3, batches=7, worldSize=2, dumps="/art/h",
        groups=[{"ranks": "0", "threads": 2, "frames": BACKWARD[0], "code": BACKWARD[1]}],
    )
    patch = records.status_patch(record.to_wire())
    assert patch is not None
    # A merge patch keeps what it does not name: an earlier collection's silent ranks must be cleared.
    assert patch["hangStacks"]["silent"] is None and patch["hangStacks"]["step"] == 3
    read = hang_diagnosis.stacks_of_record(record.to_wire())
    assert read is not None and read.groups == [StackGroup.model_validate(record.to_wire()["groups"][0])]
    with pytest.raises(ValueError, match="stack"):
        records.build_record(records.Event.HANG, stack=[])


@pytest.mark.parametrize(("ranks", "text"), [([0, 1, 2, 5, 7, 8], "0-2,5,7-8"), ([3], "3"), ([], "")])
def test_rank_lists_are_ranges(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text
    assert parse_ranks(text, 100) == ranks


def test_a_rank_list_from_a_trainer_is_bounded_by_the_gang() -> None:
    assert parse_ranks("0-4000000000,x,7-", 4) == [0, 1, 2, 3]


def test_the_users_and_dtrains_code_is_what_is_not_torch_lightning_or_the_standard_library() -> None:
    assert [is_framework(m) for m in ("torch.distributed", "lightning.pytorch", "threading", "my_models",
                                      "dtrain_trainer.runner", "__main__")] == [True, True, True, False, False, False]
