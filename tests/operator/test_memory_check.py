"""The memory pre-flight at creation: the operator reads the estimate `dtrain submit` recorded, compares it
with the spec's gpuMemory, and says so in the GPUMemoryExceeded condition and one Warning Event. It holds
nothing back, and an annotation it cannot believe is named, not obeyed."""

from __future__ import annotations

import pytest

from dtrain_operator.api import DistributedTrainingSpec
from dtrain_operator.api.memory_estimate import ANNOTATION, EstimateRecord, estimated_spec_hash
from dtrain_operator.core.status import gpu_memory
from dtrain_operator.core.status.gpu_memory import CONDITION
from tests.builders import a_cpu_job

from .cluster import Cluster

NS = "default"
pytestmark = pytest.mark.real_apiserver
GiB = 2**30
FIX = "trainer.batchSize: 64 with trainer.accumulateGradBatches: 4 (the same global batch of 256 per process; 9.1 GiB)"


def with_estimate(job: dict, peak: int, **fields: object) -> dict:
    record = EstimateRecord(peak, estimated_spec_hash(DistributedTrainingSpec.model_validate(job["spec"])), **fields)
    job["metadata"]["annotations"] = {ANNOTATION: record.encode()}
    return job


async def test_a_batch_that_does_not_fit_is_said_once_and_the_job_runs(operated: Cluster):
    job = a_cpu_job("big").on_gpus(1).with_spec(gpuMemory="16Gi").as_dict()
    await operated.apply(with_estimate(job, 40 * GiB, gpu_memory_bytes=16 * GiB, fits=False, suggestion=FIX))
    await operated.eventually(lambda: operated.condition(NS, "big", CONDITION) is not None, "the memory condition")
    condition = operated.condition(NS, "big", CONDITION)
    assert (condition["status"], condition["reason"]) == ("True", gpu_memory.REASON_EXCEEDS)
    assert "estimated peak 40.00 GiB per GPU exceeds 16.00 GiB per GPU (usable 14.25 GiB)" in condition["message"]
    assert FIX in condition["message"]
    events = await operated.event_reasons(NS, "big", [CONDITION])
    assert (events[0]["type"], events[0]["message"]) == ("Warning", condition["message"])
    # Not refused: the gang is created and runs; the warning is not repeated.
    await operated.run_all(NS, "big", 2)
    await operated.phase(NS, "big", "Running")
    await operated.event_reasons(NS, "big", [CONDITION, "Running"])
    assert operated.condition(NS, "big", CONDITION) == condition


async def test_a_fitting_a_stale_and_a_malformed_estimate(operated: Cluster):
    fits = a_cpu_job("fits").on_gpus(1).with_spec(gpuMemory="80Gi").as_dict()
    await operated.apply(with_estimate(fits, 40 * GiB))
    # Estimated at batch 32, submitted at batch 512: not this spec's estimate.
    stale = with_estimate(a_cpu_job("stale").on_gpus(1).with_spec(gpuMemory="80Gi").as_dict(), GiB)
    stale["spec"]["trainer"] = {"batchSize": 512}
    await operated.apply(stale)
    malformed = a_cpu_job("malformed").on_gpus(1).with_spec(gpuMemory="80Gi")
    malformed = malformed.with_annotations({ANNOTATION: '{"peakBytes": "a lot"}'}).as_dict()
    await operated.apply(malformed)

    expected = {
        "fits": ("False", gpu_memory.REASON_FITS),
        "stale": ("Unknown", gpu_memory.REASON_STALE),
        "malformed": ("Unknown", gpu_memory.REASON_UNREADABLE),
    }
    for name, (status, reason) in expected.items():
        await operated.eventually(lambda name=name: operated.condition(NS, name, CONDITION) is not None, f"{name}'s condition")
        condition = operated.condition(NS, name, CONDITION)
        assert (condition["status"], condition["reason"]) == (status, reason), condition
        # No warning: Events are posted in order, so none is still on its way once Running's is there.
        await operated.run_all(NS, name, 2)
        await operated.event_reasons(NS, name, ["Running"])
    assert "peakBytes must be a whole number" in operated.condition(NS, "malformed", CONDITION)["message"]
