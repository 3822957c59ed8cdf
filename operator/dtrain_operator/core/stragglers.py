"""A straggler, as rank 0 reports it in status.progress.stepTimes: the words of its condition and warning.

The trainer compares every rank's step time every spec.stragglers.everyNSteps steps
(dtrain_trainer.stragglers) and marks the slowest rank `straggler` once it has been slower than
`factor` times the median for `window` comparisons in a row. The operator turns that into the
Straggler condition and a Warning Event, `dtrain run` into a warning; neither restarts anything.
"""

from __future__ import annotations

from dtrain_operator.api import StepTimes, StragglerSettings

CONDITION = "Straggler"
REASON_DETECTED = "StragglerDetected"
REASON_NONE = "NoStraggler"


def straggler_message(times: StepTimes | None, settings: StragglerSettings) -> str | None:
    """What to say about the reported straggler (None: there is none). Stable while the same rank stays slow,
    so that one Event is posted per straggler, not one per report."""
    if times is None or not times.straggler or times.slowest_rank is None:
        return None
    where = f"pod {times.slowest_pod or '?'}" + (f" on node {times.slowest_node}" if times.slowest_node else "")
    return (
        f"rank {times.slowest_rank} ({where}) is a straggler: its step time (forward and loss, before the "
        f"gradient all-reduce) exceeded {settings.factor:g} x the median of all ranks in "
        f"{settings.window} comparisons in a row; every rank waits for it. See status.progress.stepTimes; "
        "nothing is restarted"
    )
