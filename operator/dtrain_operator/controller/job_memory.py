"""What the reconciler keeps of one job between its reconciles besides the status: the writes the watch has not
shown yet (expectations.py), and what it must neither say nor ask twice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from dtrain_operator.api import Goodput
from dtrain_operator.controller.expectations import Expectations
from dtrain_operator.controller.refusals import Refusal
from dtrain_operator.core import progress_deadline

CREATED: Final = "created"


@dataclass
class JobMemory:
    """One incarnation of a job (its expectations' uid): a job created again under the same name starts afresh."""

    expectations: Expectations
    counts_pending_since: float | None = None
    """Since when a status change of node counts alone waits, so that pods starting together share one patch."""
    conflict_reported: str = ""
    refusal_reported: str = ""
    progress_watch: progress_deadline.ProgressWatch | None = None
    """When the gang last made progress (runPolicy.progressDeadlineSeconds). Kept here, not in the status: a
    status write per progress report would double the API writes of every job; an operator that restarts watches
    afresh, so a hang is caught one deadline later at worst."""
    goodput: Goodput | None = None
    """The job's goodput as this reconcile counted it (core/goodput.py). Kept here and written only with the
    status's other changes (or every GOODPUT_WRITE_SECONDS): counted at each reconcile, it would otherwise be a
    status write of its own at every report of rank 0."""
    server_verdict: tuple[int | None, tuple[str, ...]] | None = None
    """The API server's refusals of the children of the spec at this metadata.generation (its dry run,
    core.server_check): asked once per spec, not at every reconcile of a job it refused."""
    create_outcome: Refusal | Literal["created"] | None = None
    """What the last carry-out met, for the next status: a refused create, or CREATED (every create went through
    after a refusal); None once the status says so."""

    @property
    def uid(self) -> str:
        return self.expectations.uid
