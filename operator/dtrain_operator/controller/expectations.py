"""The operator's writes that the watch has not shown yet (Kubernetes controllers' "expectations"):
a pod just created is not created again, a pod just deleted is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from dtrain_operator.core import progress_deadline
from dtrain_operator.core.observation import EngineJobObservation, PodObservation

EXPECTATION_TTL_SECONDS = 30.0
"""How long a write is trusted over a watch that has not shown it (then the watch wins again)."""


@dataclass
class Expectations:
    """One job's writes that the watch has not shown yet."""

    uid: str
    created_pods: dict[str, tuple[float, PodObservation]] = field(default_factory=dict)  # by uid
    deleted_pods: dict[str, tuple[float, bool]] = field(default_factory=dict)  # uid -> (when, known gone)
    forced_pods: dict[str, float] = field(default_factory=dict)  # uid -> when force-deleted
    engine_job: Optional[tuple[float, EngineJobObservation]] = None
    shared_children_for: Optional[int] = None  # gang generation whose Service/ConfigMap are known to exist
    counts_pending_since: Optional[float] = None
    conflict_reported: str = ""
    refusal_reported: str = ""
    # When the gang last made progress (runPolicy.progressDeadlineSeconds). Kept here, not in the
    # status: a status write per progress report would double the API writes of every job; an
    # operator that restarts watches afresh, so a hang is caught one deadline later at worst.
    progress_watch: Optional[progress_deadline.ProgressWatch] = None
