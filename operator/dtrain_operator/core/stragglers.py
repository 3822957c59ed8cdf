"""A straggler, as rank 0 reports it in status.progress.stepTimes: the words of its condition and warning.

The trainer compares every rank's step time and link time every spec.stragglers.everyNSteps steps
(dtrain_trainer.stragglers) and marks the slowest rank `straggler` once it has been slower than
`factor` times the median for `window` comparisons in a row. The operator turns that into the
Straggler condition and a Warning Event, `dtrain run` into a warning; neither restarts anything.
"""

from __future__ import annotations

from dtrain_operator.api import StepTimes, StragglerSettings, contract

CONDITION = "Straggler"
REASON_DETECTED = "StragglerDetected"
REASON_NONE = "NoStraggler"


def straggler_message(times: StepTimes | None, settings: StragglerSettings) -> str | None:
    """What to say about the reported straggler (None: there is none). Stable while the same rank stays slow,
    so that one Event is posted per straggler, not one per report."""
    if times is None or not times.straggler or times.slowest_rank is None:
        return None
    where = f"pod {times.slowest_pod or '?'}" + (f" on node {times.slowest_node}" if times.slowest_node else "")
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
