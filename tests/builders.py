"""What the tests build: a DistributedTraining, and what the operator observes of its children.

A job is built fluently and states only what its test is about, as Kubeflow Trainer's test
wrappers do (`pkg/util/testing/wrapper.go`):

    a_job("mnist").in_namespace("ml").with_nodes(3).with_devices(2).with_spec(trainer={"batchSize": 8})

then taken as the wire object (`.as_dict()`, camelCase, what a client sends) or as the model
(`.as_model()`, what the renderers, the status and `dtrain run` read). A builder never changes:
each method returns a new one, so that a module's base job can be shared by its tests.

The observations (`a_worker`, `a_gang`, `an_engine_pod`, `an_engine_job`) are what the operator
reads of the children of the job `mnist` (a_worker takes another name) whose uid is JOB_UID, made
at NOW of pods created at EARLIER; `accepted_status` is the status of a job running since EARLIER.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from dtrain_operator.api import DistributedTraining, DistributedTrainingStatus, contract, immutable_spec
from dtrain_operator.core.observation import EngineJobObservation, PodObservation, format_time

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
"""When the observations are made (the `now` of the status and plan under test)."""
EARLIER = NOW - timedelta(minutes=10)
"""When the observed pods were created and the job started."""
JOB_UID = "0b8e1f9e-7c44-4c1f-a2b6-1d7e3f6f2a11"
"""The uid of the job that owns the observed pods and engine Job."""


class JobBuilder:
    """A DistributedTraining under construction; every method returns a new builder."""

    def __init__(self, document: dict[str, Any]) -> None:
        self._document = document

    def _with(self, path: str, value: Any) -> JobBuilder:
        """A copy with `value` at the dotted `path` from the object's root, its siblings kept."""
        document = copy.deepcopy(self._document)
        *parents, last = path.split(".")
        node = document
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = copy.deepcopy(value)
        return JobBuilder(document)

    # --- Metadata ---------------------------------------------------------------------------------

    def in_namespace(self, namespace: str) -> JobBuilder:
        return self._with("metadata.namespace", namespace)

    def with_uid(self, uid: str = JOB_UID) -> JobBuilder:
        """The uid the API server gave it: what its children's ownerReferences name."""
        return self._with("metadata.uid", uid)

    def with_annotations(self, annotations: dict[str, str]) -> JobBuilder:
        return self._with("metadata.annotations", annotations)

    def in_queue(self, local_queue: str) -> JobBuilder:
        """Labelled for Kueue: queued in `local_queue`."""
        return self._with("metadata.labels", {"kueue.x-k8s.io/queue-name": local_queue})

    def at_generation(self, generation: int) -> JobBuilder:
        """metadata.generation, which the API server bumps on every change of the spec."""
        return self._with("metadata.generation", generation)

    # --- Where it runs ----------------------------------------------------------------------------

    def with_nodes(self, count: int) -> JobBuilder:
        return self._with("spec.nodes", count)

    def with_devices(self, per_node: int) -> JobBuilder:
        """spec.devicesPerNode: training processes per pod (GPUs with accelerator gpu)."""
        return self._with("spec.devicesPerNode", per_node)

    def on_cpu(self) -> JobBuilder:
        return self._with("spec.accelerator", "cpu")

    def on_gpus(self, per_node: int) -> JobBuilder:
        return self._with("spec.accelerator", "gpu").with_devices(per_node)

    def with_engine(self, enabled: bool = True) -> JobBuilder:
        """spec.engine.enabled: the TensorRT engine step after training (the other engine settings kept)."""
        return self._with("spec.engine.enabled", enabled)

    def without_engine(self) -> JobBuilder:
        return self.with_engine(False)

    # --- Run policy -------------------------------------------------------------------------------

    def with_restart_policy(self, policy: str) -> JobBuilder:
        return self._with("spec.runPolicy.restartPolicy", policy)

    def with_restart_strategy(self, strategy: str) -> JobBuilder:
        return self._with("spec.runPolicy.restartStrategy", strategy)

    def with_backoff_limit(self, limit: int) -> JobBuilder:
        return self._with("spec.runPolicy.backoffLimit", limit)

    def with_failure_rules(self, *rules: dict[str, Any]) -> JobBuilder:
        """spec.runPolicy.failureRules, in order: `with_failure_rules({"action": "FailJob", "onExitCodes": [3]})`."""
        return self._with("spec.runPolicy.failureRules", list(rules))

    def with_deadline(self, seconds: int) -> JobBuilder:
        """spec.runPolicy.activeDeadlineSeconds."""
        return self._with("spec.runPolicy.activeDeadlineSeconds", seconds)

    def with_progress_deadline(self, seconds: int) -> JobBuilder:
        return self._with("spec.runPolicy.progressDeadlineSeconds", seconds)

    def with_ttl(self, seconds: int) -> JobBuilder:
        """spec.runPolicy.ttlSecondsAfterFinished."""
        return self._with("spec.runPolicy.ttlSecondsAfterFinished", seconds)

    def with_clean_pod_policy(self, policy: str) -> JobBuilder:
        return self._with("spec.runPolicy.cleanPodPolicy", policy)

    def suspended(self, value: bool = True) -> JobBuilder:
        return self._with("spec.runPolicy.suspend", value)

    # --- Scheduling -------------------------------------------------------------------------------

    def with_schedule_timeout(self, seconds: int) -> JobBuilder:
        """spec.scheduling.gang.scheduleTimeoutSeconds: how long pods may stay Pending before it is reported."""
        return self._with("spec.scheduling.gang.scheduleTimeoutSeconds", seconds)

    def with_gang_scheduling(self, scheduler: str) -> JobBuilder:
        """All workers or none, through `scheduler`'s PodGroup."""
        return self._with("spec.scheduling.schedulerName", scheduler)._with("spec.scheduling.gang.enabled", True)

    def with_native_gang_scheduling(self) -> JobBuilder:
        """All workers or none, through Kubernetes' own PodGroup (1.36) and the default scheduler."""
        return self._with("spec.scheduling.gang.provider", "kubernetes")._with("spec.scheduling.gang.enabled", True)

    # --- Anything else ----------------------------------------------------------------------------

    def with_spec(self, **fields: Any) -> JobBuilder:
        """Top-level spec fields by their wire names (`hostNetwork=True`, `trainer={...}`), each replacing
        what the builder had there."""
        builder = self
        for name, value in fields.items():
            builder = builder._with(f"spec.{name}", value)
        return builder

    # --- The job ----------------------------------------------------------------------------------

    def as_dict(self) -> dict[str, Any]:
        """The wire object, as a client sends it (camelCase; only what was stated)."""
        return copy.deepcopy(self._document)

    def without_storage(self) -> JobBuilder:
        """No spec.storage: checkpoints on a pod-local emptyDir; a cluster refuses it with several nodes or the engine."""
        document = copy.deepcopy(self._document)
        document["spec"].pop("storage", None)
        return JobBuilder(document)

    def as_model(self) -> DistributedTraining:
        """The object as the operator and `dtrain run` read it (every default filled in)."""
        return DistributedTraining.model_validate(self.as_dict())


SHARED_STORAGE = {"url": "s3://dtrain-test/jobs"}
"""What every built job has, as a cluster requires of a job with the engine step or several nodes: object
storage, which adds no volume and no variable to the pods (`without_storage()` takes it away)."""


def a_job(name: str = "mnist") -> JobBuilder:
    """A job that states its name and shared storage: every other spec field at the API's default (one GPU node,
    the engine step on)."""
    return JobBuilder(
        {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "metadata": {"name": name},
         "spec": {"storage": dict(SHARED_STORAGE)}}
    )


def a_cpu_job(name: str = "mnist") -> JobBuilder:
    """Two CPU workers in namespace default that only train (no engine step): the job the operator tests
    submit, whose life ends at Succeeded unless a test plays the engine Job."""
    return a_job(name).in_namespace("default").with_nodes(2).on_cpu().without_engine()


# --- What the operator observes -------------------------------------------------------------------


def a_worker(
    rank: int, phase: str = "Running", generation: int = 0, job: str = "mnist", **fields: Any
) -> PodObservation:
    """Worker `rank` of gang `generation`, created at EARLIER and scheduled unless Pending; `fields` as
    observe_pod reads them (exit_code, reason, message, lost, finished_at, ...)."""
    observed = PodObservation(
        name=f"{job}-{rank}", uid=f"uid-{generation}-{rank}", resource_version="1", role=contract.ROLE_WORKER,
        rank=rank, generation=generation, phase=phase, created_at=EARLIER, scheduled=phase != "Pending",
        owner_uid=JOB_UID,
    )
    return replace(observed, **fields)


def a_gang(*phases: str, generation: int = 0) -> tuple[PodObservation, ...]:
    """One worker per phase, ranks in order: `a_gang("Running", "Failed", "Running")`."""
    return tuple(a_worker(rank, phase, generation) for rank, phase in enumerate(phases))


def an_engine_pod(phase: str, message: str = "") -> PodObservation:
    """The engine Job's pod; `message` is its termination message (the engine's results or error)."""
    return replace(a_worker(0, phase), name="mnist-engine-x", role=contract.ROLE_ENGINE, rank=None, generation=None,
                   message=message, owner_uid="engine-uid")


def an_engine_job(succeeded: bool = False, failed: bool = False, finished_at: datetime = NOW) -> EngineJobObservation:
    """The engine Job, running until it `succeeded` or `failed` (at `finished_at`)."""
    return EngineJobObservation(
        name="mnist-engine", uid="engine-uid", resource_version="1", succeeded=succeeded, failed=failed,
        owner_uid=JOB_UID, finished_at=finished_at if succeeded or failed else None,
    )


def accepted_status(
    job: DistributedTraining, phase: str = "Running", restarts: int = 0, **fields: Any
) -> DistributedTrainingStatus:
    """The status of a job the operator has been running since EARLIER: its spec accepted; `fields` by wire name."""
    return DistributedTrainingStatus.model_validate(
        {"phase": phase, "restarts": restarts, "startTime": format_time(EARLIER),
         "acceptedSpec": immutable_spec(job.spec), **fields}
    )



def read_back(status: DistributedTrainingStatus) -> DistributedTrainingStatus:
    """`status` as the operator writes it (its own fields) and the next reconcile starts from it."""
    from dtrain_operator.core.status.events import status_patch
    from dtrain_operator.core.status.read import read_status, starting_status

    read = read_status({"status": status_patch(None, status) or {}})
    assert not read.problems, read.problems
    return starting_status(read.status)
