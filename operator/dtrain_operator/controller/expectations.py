"""The operator's writes that the watch has not shown yet (Kubernetes controllers' "expectations"):
a pod just created is not created again, a pod just deleted is not counted.

kopf has no equivalent: its handlers see what the watch shows. What this buys is measured by
bench/operator_scale.py on the real API server: exactly `nodes` pod creations and one Service per job,
also when kube-apiserver closed the operator's watches as too slow and they were resumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dtrain_operator.api import contract
from dtrain_operator.core.observation import EngineJobObservation, Observed, PodObservation

EXPECTATION_TTL_SECONDS = 30.0
"""How long a write is trusted over a watch that has not shown it (then the watch wins again)."""


@dataclass
class Expectations:
    """One job's writes that the watch has not shown yet."""

    uid: str
    created_pods: dict[str, tuple[float, PodObservation]] = field(default_factory=dict)  # by uid
    deleted_pods: dict[str, tuple[float, bool]] = field(default_factory=dict)  # uid -> (when, known gone)
    forced_pods: dict[str, float] = field(default_factory=dict)  # uid -> when force-deleted
    engine_job: tuple[float, EngineJobObservation] | None = None
    shared_children_for: int | None = None  # gang generation whose Service (PodGroup...) is known to exist


def observe_with_expectations(
    pods: list[PodObservation], engine_jobs: list[EngineJobObservation], expectations: Expectations, now: float
) -> tuple[Observed, frozenset[str]]:
    """The job's children as the watch shows them, corrected by writes it has not shown yet (`now`: monotonic).

    Returns the observation and the names of worker pods the job does not own (they block creation).
    """
    seen = {p.uid for p in pods}
    for uid, (since, _) in list(expectations.created_pods.items()):
        if uid in seen or now - since > EXPECTATION_TTL_SECONDS:
            del expectations.created_pods[uid]
    for uid, (since, _) in list(expectations.deleted_pods.items()):
        if uid not in seen and now - since > EXPECTATION_TTL_SECONDS:
            del expectations.deleted_pods[uid]

    owned: list[PodObservation] = []
    blocked: set[str] = set()
    for pod in pods:
        deleted = expectations.deleted_pods.get(pod.uid)
        if deleted is not None and deleted[1]:
            continue
        if deleted is not None and not pod.deleting:
            pod = replace(pod, deleting=True)
        if pod.role == contract.ROLE_WORKER and pod.owner_uid != expectations.uid:
            blocked.add(pod.name)
            continue
        owned.append(pod)
    owned.extend(p for _, p in expectations.created_pods.values() if p.uid not in seen)

    engine_job = next((j for j in engine_jobs if j.owner_uid == expectations.uid), None)
    if expectations.engine_job is not None:
        since, created = expectations.engine_job
        if engine_job is not None or now - since > EXPECTATION_TTL_SECONDS:
            expectations.engine_job = None
        else:
            engine_job = created
    workers = tuple(p for p in owned if p.role == contract.ROLE_WORKER)
    engine_pods = tuple(
        p for p in owned if p.role == contract.ROLE_ENGINE and engine_job is not None and p.owner_uid == engine_job.uid
    )
    standby = tuple(p for p in owned if p.role == contract.ROLE_STANDBY)
    return Observed(workers=workers, standby=standby, engine_pods=engine_pods, engine_job=engine_job), frozenset(blocked)
