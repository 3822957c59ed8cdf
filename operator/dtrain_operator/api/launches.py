"""What a worker pod's supervisor and the operator say to each other: the records of an in-place restart.

Each worker pod runs dtrain's supervisor (dtrain_trainer.supervisor) around torchrun. It POSTs a
`LaunchReport` to the operator's report endpoint (contract.launch_path, authenticated as rank 0's
records are) when it starts, when torchrun exits and while it waits; the answer is a `LaunchOrder`:
run torchrun for the pod's gang generation, stop it, wait, or exit. The operator holds a request
open (up to POLL_SECONDS) until its order differs from what the supervisor reports doing, so an
order reaches every pod at once without a poll per second.

A launch is one run of torchrun in a pod, named by the gang generation it belongs to. A restart in
place (runPolicy.restartStrategy InPlace) stops every pod's torchrun, relabels the pods with the new
generation once every supervisor says its torchrun is gone (the barrier), and orders them to run
it; nothing is rescheduled. Nothing a supervisor says decides what the operator creates: an exit it
reports counts as a worker's failure, as the same exit of a container would.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt

from dtrain_operator.api.common import ApiModel

LaunchState = Literal["running", "exited"]
STATE_RUNNING: LaunchState = "running"
STATE_EXITED: LaunchState = "exited"
LaunchAction = Literal["run", "stop", "wait", "exit"]
ACTION_RUN: LaunchAction = "run"
ACTION_STOP: LaunchAction = "stop"
ACTION_WAIT: LaunchAction = "wait"
ACTION_EXIT: LaunchAction = "exit"

# How long the operator holds a supervisor's request while its order stays what the supervisor does.
POLL_SECONDS = 15.0
# A supervisor that has not reported for this long is not counted on for a restart in place: its pod
# may be cut off from the operator (a network cut), and could not be told to restart. A supervisor asks
# again as soon as it is answered, so a live one is heard from at least every POLL_SECONDS.
REPORT_FRESH_SECONDS = POLL_SECONDS + 10.0
# The reason of an exit the supervisor made itself, on the operator's order.
REASON_STOPPED = "Stopped"
# What a supervisor can know of its torchrun's exit; nothing else. Why a pod ended beyond that (an eviction, a
# deletion, a lost node, Kueue's stop) the operator reads from the API, never from a worker's word.
ExitReason = Literal["Error", "OOMKilled", "Stopped"]
MAX_MESSAGE_CHARS = 2048


class LaunchReport(ApiModel):
    """A supervisor's word about its pod's torchrun."""

    generation: Annotated[StrictInt, Field(ge=0)]
    """The gang generation of the launch it ran last (or runs)."""
    state: LaunchState
    """running: torchrun runs. exited: it ended (by itself, or stopped on an order)."""
    exit_code: Annotated[StrictInt, Field(ge=0, le=255)] | None = None
    """torchrun's exit code as a container reports one (128 + n for signal n); with state exited."""
    reason: ExitReason | None = None
    """Why it exited as Kubernetes would say it: Error, OOMKilled (the container's cgroup killed it), Stopped (on an
    order). Any other word is refused: a worker's code runs in the pod, and a reason it chose must not pass for
    the operator's observation (a Kueue eviction or a lost node restart a gang without counting it)."""
    message: Annotated[str, Field(max_length=MAX_MESSAGE_CHARS)] | None = None
    """The end of what the trainer wrote to its termination log, or of its output, as a pod's termination message."""
    sequence: Annotated[StrictInt, Field(ge=0)] = 0
    """Counts the supervisor's reports: one that arrives after a newer one is ignored."""

    @property
    def stopped_on_order(self) -> bool:
        return self.state == STATE_EXITED and self.reason == REASON_STOPPED


class LaunchOrder(ApiModel):
    """The operator's answer: what the supervisor does now."""

    action: LaunchAction
    """run: run torchrun for `generation` (stop an older one first). stop: stop torchrun (SIGTERM, then SIGKILL after
    graceSeconds) and report. wait: keep as is and ask again. exit: stop torchrun if it runs, then exit with its code."""
    generation: Annotated[StrictInt, Field(ge=0)]
    """The pod's gang generation, as the operator labelled it."""
    grace_seconds: Annotated[StrictInt, Field(ge=0)] = 30
    """With stop or exit: how long torchrun has after SIGTERM."""
    why: Annotated[str, Field(max_length=MAX_MESSAGE_CHARS)] = ""
    """For the supervisor's log."""
