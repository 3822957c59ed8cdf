"""A straggler, as rank 0 reports it in status.progress.stepTimes: the words of its condition and warning.

The trainer compares every rank's step time and link time every spec.stragglers.everyNSteps steps
(dtrain_trainer.stragglers) and marks the slowest rank `straggler` once it has been slower than
`factor` times the median for `window` comparisons in a row. The operator turns that into the
Straggler condition and a Warning Event, `dtrain run` into a warning; neither restarts anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dtrain_operator.api import StepTimes, StragglerSettings, contract
from dtrain_operator.api.reasons import condition_type, reason
from dtrain_operator.core.observation import PodObservation

CONDITION = condition_type(
    "Straggler", "one rank has been slower than the others (its step or link time) for spec.stragglers.window "
    "comparisons in a row; nothing restarts", "check the node and the network the message names",
)
REASON_DETECTED = reason("StragglerDetected", "rank 0 reports a straggler (Straggler)", "check the node it names")
REASON_NONE = reason("NoStraggler", "no rank is slower than the others now (Straggler False)")


def straggler_message(times: StepTimes | None, settings: StragglerSettings, place: Callable[[int], str]) -> str | None:
    """What to say about the reported straggler (None: there is none). Stable while the same rank stays slow,
    so that one Event is posted per straggler, not one per report. `place(rank)` names where that rank runs, from
    the caller's own view of the gang (the operator's pods and their nodes): never the pod and node rank 0 named,
    which a job's own code could choose (someone may drain the node named)."""
    if times is None or not times.straggler or times.slowest_rank is None:
        return None
    where = place(times.slowest_rank)
    measured = (
        f"its link time (its ring neighbours' fetch of {contract.LINK_PROBE_BYTES >> 20} MiB from it; check its network "
        "interface and link)"
        if times.measure == "link" else "its step time (forward and loss, before the gradient all-reduce)"
    )
    return (
        f"rank {times.slowest_rank} ({where}) is a straggler: {measured} exceeded {settings.factor:g} x the "
        f"median of all ranks in {settings.window} comparisons in a row; every rank waits for it. "
        "See status.progress.stepTimes; nothing is restarted"
    )


def place_in_gang(gang: Mapping[int, PodObservation], devices_per_node: int) -> Callable[[int], str]:
    """Where a global rank runs, as the operator sees its gang: its node rank's pod and that pod's node."""

    def place(rank: int) -> str:
        pod = gang.get(rank // devices_per_node) if rank >= 0 else None
        if pod is None:
            return "no pod of the current gang"
        return f"pod {pod.name}" + (f" on node {pod.node}" if pod.node else "")

    return place
