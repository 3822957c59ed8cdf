"""The pure parts of the survivor's checkpoint (dtrain_trainer.survivor): which errors mean a peer was lost, which
survivor writes, and which state is the last completed update's. The whole of it runs in tests/local/test_run.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from dtrain_trainer.survivor import Claim, ClaimBoard, StepTracker, choose_writer, error_mark, is_peer_loss, parse_claim


@pytest.mark.parametrize(
    "message",
    [
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234",
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:586] Read error [10.0.0.2]:29511: Connection reset by peer",
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:610] Write error [10.0.0.2]:29511: Broken pipe",
        "NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.27",
        "NCCL communicator was aborted on rank 0.",
    ],
)
def test_a_collective_whose_peer_went_away_is_a_peer_loss(message: str) -> None:
    assert is_peer_loss(RuntimeError(message))
    assert is_peer_loss(torch.distributed.DistBackendError(message))


def test_a_peer_loss_wrapped_in_another_error_is_found_through_its_cause() -> None:
    try:
        try:
            raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")
        except RuntimeError as inner:
            raise ValueError("while training") from inner
    except ValueError as outer:
        assert is_peer_loss(outer)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("[gloo] Timed out waiting 1800000ms for recv operation to complete"),
        ValueError("Connection closed by peer"),  # not from a collective
        KeyboardInterrupt(),
    ],
    ids=["oom", "timeout-of-a-hung-peer", "not-a-runtime-error", "interrupt"],
)
def test_other_errors_are_not_a_peer_loss(error: BaseException) -> None:
    assert not is_peer_loss(error)


def test_the_mark_keeps_the_errors_first_line_shortened() -> None:
    assert error_mark(RuntimeError("Connection closed by peer\nException raised from ...")) == "Connection closed by peer"
    assert len(error_mark(RuntimeError("x" * 1000))) == 300


def test_the_writer_is_the_lowest_rank_of_those_that_hold_the_newest_step() -> None:
    assert choose_writer([Claim(7, 3), Claim(7, 1), Claim(7, 2)]) == Claim(7, 1)
    # A rank that completed one step more before the loss reached it holds the newer state.
    assert choose_writer([Claim(7, 0), Claim(8, 2), Claim(8, 5)]) == Claim(8, 2)
    assert choose_writer([]) is None


def test_claims_are_files_named_by_step_and_rank(tmp_path: Path) -> None:
    assert parse_claim(Claim(12, 3).name) == Claim(12, 3)
    assert parse_claim("step=00000012.ckpt") is None
    board = ClaimBoard(str(tmp_path))
    # Two survivors of a world of 4 (one rank lost): the second waits for the first, and both choose rank 1.
    board.post(Claim(5, 2))
    assert board.elect(Claim(5, 1), expected=2, settle_seconds=0) == Claim(5, 1)
    assert ClaimBoard(str(tmp_path)).elect(Claim(5, 2), expected=3, settle_seconds=0.2) == Claim(5, 1)
    board.clear()
    assert board.claims() == [] and sorted(p.name for p in tmp_path.iterdir()) == []


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(2)
        self.linear = nn.Linear(2, 1)
        self.register_buffer("static", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x))  # type: ignore[no-any-return]


class _Training:
    """A model, an optimizer and a global step that moves once every `accumulate` batches."""

    def __init__(self, accumulate: int = 1) -> None:
        torch.manual_seed(0)
        self.net = _Net()
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.accumulate = accumulate
        self.batches = 0
        self.step = 0
        self.tracker = StepTracker(0, self.net)

    def loops(self) -> dict[str, Any]:
        return {"batches": self.batches, "step": self.step}

    def forward_backward(self) -> None:
        self.net(torch.randn(4, 2)).sum().backward()

    def batch(self) -> None:
        self.forward_backward()
        self.batches += 1
        if self.batches % self.accumulate == 0:
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.step += 1
        self.tracker.batch_ended(self.step, 0, self.loops)


def test_the_state_saved_is_that_of_the_last_completed_update_with_gradient_accumulation() -> None:
    training = _Training(accumulate=3)
    assert training.tracker.savable(0, saved_step=None)[0] is None  # no step done yet: nothing to save
    for _ in range(6):
        training.batch()
    weights = {k: v.clone() for k, v in training.net.state_dict().items()}
    # Two micro-batches of step 3, then the third's backward fails (its all-reduce): no update applied.
    training.batch()
    training.batch()
    training.forward_backward()
    snapshot, why = training.tracker.savable(training.step, saved_step=None)
    assert snapshot is not None, why
    assert (snapshot.step, snapshot.loops) == (2, {"batches": 6, "step": 2})  # not 8 batches: step 2's position
    # The model's buffers are put back as they were after step 2; the parameters were never touched.
    state = {**training.net.state_dict(), **snapshot.buffers}
    assert set(snapshot.buffers) == {"norm.running_mean", "norm.running_var", "norm.num_batches_tracked", "static"}
    for name, value in weights.items():
        torch.testing.assert_close(state[name], value, msg=name)
    assert int(training.net.norm.num_batches_tracked) == 9 and int(state["norm.num_batches_tracked"]) == 6


def test_nothing_is_saved_once_an_update_was_applied_after_the_last_boundary_seen() -> None:
    training = _Training()
    training.batch()
    training.forward_backward()
    training.optimizer.step()  # the update of step 2, before its end was seen
    snapshot, why = training.tracker.savable(1, saved_step=None)
    assert snapshot is None and "an update was applied after step 1" in why


def test_a_step_saved_already_is_not_saved_again() -> None:
    training = _Training()
    training.batch()
    snapshot, why = training.tracker.savable(1, saved_step=1)
    assert snapshot is None and why == "step 1 is saved already"
