"""kopf's handlers: thin. They turn watch events into observations and queue the owning job;
the reconciler (reconciler.py) does the work.

kopf runs the index handlers first and holds every other handler until all indexes have their
initial listing, so that a job is never reconciled before its pods and engine Job are known.
All handlers are coroutines: they run in the event loop, next to the controller's caches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from dtrain_operator.api import contract
from dtrain_operator.controller.reconciler import ENGINE_JOB_INDEX, POD_INDEX, SERVICE_INDEX, Controller
from dtrain_operator.core.observation import EngineJobObservation, PodObservation
from dtrain_operator.core.status.observe import controller_uid, observe_engine_job, observe_pod

JOB_CHILD: Mapping[str, Any] = {contract.LABEL_JOB_NAME: kopf.PRESENT}
ENGINE_JOB: Mapping[str, Any] = {contract.LABEL_JOB_NAME: kopf.PRESENT, contract.LABEL_ROLE: contract.ROLE_ENGINE}


def build_registry(controller: Controller) -> kopf.OperatorRegistry:
    """The operator's handlers, registered on their own registry (no module-level state)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return await controller.login()

    @kopf.on.startup(registry=registry)
    async def start_reconciler(**_: Any) -> None:
        await controller.start()

    @kopf.on.cleanup(registry=registry)
    async def stop_reconciler(**_: Any) -> None:
        await controller.stop()

    @kopf.on.probe(registry=registry, id="reconcileQueue")
    async def reconcile_queue(**_: Any) -> int:
        return controller.queue_length()

    @kopf.index("pods", labels=JOB_CHILD, registry=registry, id=POD_INDEX)
    async def job_pods(
        body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any
    ) -> dict[tuple[str, str], PodObservation]:
        return {(namespace or "", labels[contract.LABEL_JOB_NAME]): observe_pod(body)}

    @kopf.index("batch", "v1", "jobs", labels=ENGINE_JOB, registry=registry, id=ENGINE_JOB_INDEX)
    async def engine_jobs(
        body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any
    ) -> dict[tuple[str, str], EngineJobObservation]:
        return {(namespace or "", labels[contract.LABEL_JOB_NAME]): observe_engine_job(body)}

    # The Services: which job's is there, and whose it is, so that a gang after the first needs no read of its own.
    @kopf.index("services", labels=JOB_CHILD, registry=registry, id=SERVICE_INDEX)
    async def job_services(
        body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any
    ) -> dict[tuple[str, str], str | None]:
        return {(namespace or "", labels[contract.LABEL_JOB_NAME]): controller_uid(body.get("metadata") or {})}

    # kopf hands its indexes to handlers as keyword arguments named after the index handlers.
    @kopf.on.event(contract.GROUP, contract.VERSION, contract.PLURAL, registry=registry)
    async def distributed_training(type: str, body: kopf.Body, **kwargs: Any) -> None:
        controller.use_indexes(kwargs)
        controller.job_changed(type, {key: body[key] for key in body})

    @kopf.on.event("pods", labels=JOB_CHILD, registry=registry)
    async def pod(type: str, namespace: str | None, labels: kopf.Labels, uid: str, **kwargs: Any) -> None:
        controller.use_indexes(kwargs)
        controller.child_changed(namespace or "", labels[contract.LABEL_JOB_NAME], uid, type)

    @kopf.on.event("batch", "v1", "jobs", labels=ENGINE_JOB, registry=registry)
    async def engine_job(type: str, namespace: str | None, labels: kopf.Labels, uid: str, **kwargs: Any) -> None:
        controller.use_indexes(kwargs)
        controller.child_changed(namespace or "", labels[contract.LABEL_JOB_NAME], uid, type)

    return registry
