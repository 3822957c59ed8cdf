"""The operator's memory pre-flight: the estimate `dtrain submit` records, read strictly and compared with
the GPU memory the spec states (gpu_memory.py), and the condition and Event at creation (core/status/compute.py)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from dtrain_operator.api import DistributedTrainingSpec, contract, memory_estimate
from dtrain_operator.api.memory_estimate import (
    ANNOTATION,
    EstimateRecord,
    decode,
    estimated_spec_hash,
    parse_memory,
    spec_gpu_memory,
    usable_bytes,
)
from dtrain_operator.api.validation import validate_object
from dtrain_operator.core.observation import Observed
from dtrain_operator.core.status import gpu_memory
from dtrain_operator.core.status.compute import compute_status
from dtrain_operator.core.status.events import status_events
from dtrain_operator.core.status.gpu_memory import CONDITION, verdict
from tests.builders import SHARED_STORAGE, a_job

GiB = 2**30
NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
FIX = "trainer.batchSize: 128 with trainer.accumulateGradBatches: 2 (the same global batch of 256 per process; 21.0 GiB)"


def gpu_spec(**fields: Any) -> DistributedTrainingSpec:
    return DistributedTrainingSpec.model_validate(
        {"nodes": 2, "accelerator": "gpu", "engine": {"enabled": False}, "storage": SHARED_STORAGE, **fields}
    )


def annotation(spec: DistributedTrainingSpec, peak: int, **extra: Any) -> dict[str, str]:
    record = EstimateRecord(peak_bytes=peak, spec_hash=estimated_spec_hash(spec), **extra)
    return {ANNOTATION: record.encode()}


# --- The arithmetic both sides share ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,count",
    [("32Gi", 32 * GiB), ("80G", 80 * 10**9), ("40960Mi", 40 * GiB), ("1.5Gi", 3 * GiB // 2), (" 16Gi ", 16 * GiB)],
)
def test_memory_sizes(text: str, count: int) -> None:
    assert parse_memory(text) == count


@pytest.mark.parametrize("text", ["lots", "32", "-1Gi", "1e3Gi", "32GB", "1234567890Gi", ""])
def test_what_is_not_a_memory_size_is_refused_with_an_example(text: str) -> None:
    with pytest.raises(ValueError, match="32Gi"):
        parse_memory(text)


def test_usable_memory_leaves_out_the_context_and_a_fragmentation_margin() -> None:
    assert usable_bytes(32 * GiB) == int(31 * GiB * 0.95)
    assert usable_bytes(GiB // 2) == 0  # less than the CUDA context: nothing, not a negative size


def test_the_gpu_memory_comes_from_the_spec_else_the_node_selector_label() -> None:
    assert spec_gpu_memory(gpu_spec(gpuMemory="80G")) == 80 * 10**9
    labelled = {"scheduling": {"nodeSelector": {contract.LABEL_GPU_MEMORY: "32768"}}}
    assert spec_gpu_memory(gpu_spec(**labelled)) == 32 * GiB
    assert spec_gpu_memory(gpu_spec(gpuMemory="16Gi", **labelled)) == 16 * GiB  # the field says it outright
    assert spec_gpu_memory(gpu_spec(scheduling={"nodeSelector": {contract.LABEL_GPU_MEMORY: "lots"}})) is None
    assert spec_gpu_memory(gpu_spec()) is None
    assert spec_gpu_memory(gpu_spec(accelerator="cpu", gpuMemory="32Gi")) is None


@pytest.mark.parametrize("value", ["32", "32GB", "a lot", "1234567890Gi", 32])
def test_a_bad_gpu_memory_field_is_refused_naming_it(value: Any) -> None:
    result = validate_object(a_job("x").with_spec(gpuMemory=value).as_dict())
    assert result.errors and all("gpuMemory" in e for e in result.errors), result.errors


# --- The verdict -------------------------------------------------------------------------------------


def test_a_batch_that_does_not_fit_says_the_numbers_and_the_fix() -> None:
    spec = gpu_spec(gpuMemory="32Gi")
    result = verdict(annotation(spec, 40 * GiB, gpu_memory_bytes=32 * GiB, fits=False, suggestion=FIX), spec)
    assert result is not None and (result.status, result.reason) == ("True", gpu_memory.REASON_EXCEEDS)
    assert "estimated peak 40.00 GiB per GPU exceeds 32.00 GiB per GPU (usable 29.45 GiB)" in result.message
    assert f"fits instead: {FIX}" in result.message and "The job runs as it is" in result.message


def test_a_fix_worked_out_for_another_gpu_is_not_repeated() -> None:
    spec = gpu_spec(gpuMemory="16Gi")
    result = verdict(annotation(spec, 20 * GiB, gpu_memory_bytes=32 * GiB, suggestion=FIX), spec)
    assert result is not None and result.status == "True"
    assert FIX not in result.message and "dtrain validate --estimate" in result.message


def test_a_batch_that_fits() -> None:
    spec = gpu_spec(scheduling={"nodeSelector": {contract.LABEL_GPU_MEMORY: "81920"}})
    result = verdict(annotation(spec, 40 * GiB), spec)
    assert result is not None and (result.status, result.reason) == ("False", gpu_memory.REASON_FITS)
    assert result.message == "estimated peak 40.00 GiB per GPU fits in 80.00 GiB per GPU (usable 75.05 GiB)"


def test_the_gpu_memory_the_annotation_claims_is_not_believed() -> None:
    spec = gpu_spec()
    result = verdict(annotation(spec, 40 * GiB, gpu_memory_bytes=80 * GiB, fits=True), spec)
    assert result is not None and (result.status, result.reason) == ("Unknown", gpu_memory.REASON_GPU_MEMORY_UNKNOWN)
    assert "set gpuMemory" in result.message and contract.LABEL_GPU_MEMORY in result.message


def test_an_estimate_of_another_spec_is_stale() -> None:
    estimated = gpu_spec(gpuMemory="32Gi", trainer={"batchSize": 64})
    submitted = gpu_spec(gpuMemory="32Gi", trainer={"batchSize": 512})
    result = verdict(annotation(estimated, GiB), submitted)
    assert result is not None and (result.status, result.reason) == ("Unknown", gpu_memory.REASON_STALE)
    assert "dtrain submit" in result.message


def test_env_values_and_suspend_do_not_make_an_estimate_stale() -> None:
    """What the operator may change or hide of a spec is not what the estimate is of."""
    estimated = gpu_spec(gpuMemory="32Gi", env=[{"name": "A", "value": "1"}])
    submitted = gpu_spec(gpuMemory="32Gi", env=[{"name": "A", "value": "2"}], runPolicy={"suspend": True})
    result = verdict(annotation(estimated, GiB), submitted)
    assert result is not None and result.reason == gpu_memory.REASON_FITS


def test_no_condition_without_anything_to_compare() -> None:
    assert verdict({}, gpu_spec()) is None
    assert verdict(None, gpu_spec(scheduling={"nodeSelector": {contract.LABEL_GPU_MEMORY: "32768"}})) is None
    cpu = gpu_spec(accelerator="cpu")
    assert verdict(annotation(cpu, 100 * GiB), cpu) is None


def test_a_stated_gpu_memory_without_an_estimate_says_how_to_get_one() -> None:
    result = verdict({}, gpu_spec(gpuMemory="32Gi"))
    assert result is not None and (result.status, result.reason) == ("Unknown", gpu_memory.REASON_NO_ESTIMATE)
    assert "dtrain submit" in result.message and "dtrain validate --estimate" in result.message


def _record(**fields: Any) -> str:
    spec_hash = estimated_spec_hash(gpu_spec(gpuMemory="32Gi"))
    return json.dumps({"peakBytes": GiB, "specHash": spec_hash, **fields})


MALFORMED = {
    "not JSON": ("{peakBytes: 1", "not JSON"),
    "a list": ("[1, 2]", "not a JSON object"),
    "a number": ("42", "not a JSON object"),
    "no peak": (json.dumps({"specHash": "sha256:" + "0" * 64}), "peakBytes is missing"),
    "peak a string": (_record(peakBytes="40Gi"), "peakBytes must be a whole number"),
    "peak a float": (_record(peakBytes=1.5e9), "peakBytes must be a whole number"),
    "peak a bool": (_record(peakBytes=True), "peakBytes must be a whole number"),
    "peak negative": (_record(peakBytes=-1), "peakBytes must be a whole number"),
    "peak huge": (_record(peakBytes=10**400), "peakBytes must be a whole number"),
    "gpu memory a string": (_record(gpuMemoryBytes="32Gi"), "gpuMemoryBytes must be a whole number"),
    "fits a string": (_record(fits="yes"), "fits must be true or false"),
    "suggestion a list": (_record(suggestion=["a"]), "suggestion must be one printable line"),
    "suggestion two lines": (_record(suggestion="a\nb"), "suggestion must be one printable line"),
    "suggestion too long": (_record(suggestion="x" * 301), "suggestion must be one printable line"),
    "hash malformed": (_record(specHash="md5:abc"), "specHash must be sha256"),
    "unknown key": (_record(peakBytesV2=1), "unknown key(s) peakBytesV2"),
    "too big": (_record(suggestion="x" * 100, padding=" " * 4096), "more than the 2048 read"),
}


@pytest.mark.parametrize("text,message", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_annotation_is_named_not_believed(text: str, message: str) -> None:
    with pytest.raises(memory_estimate.UnreadableEstimate, match=message.replace("(", r"\(").replace(")", r"\)")):
        decode(text)
    result = verdict({ANNOTATION: text}, gpu_spec(gpuMemory="32Gi"))
    assert result is not None and (result.status, result.reason) == ("Unknown", gpu_memory.REASON_UNREADABLE)
    assert result.message.startswith(f"annotation {ANNOTATION} is not a memory estimate: ") and message in result.message


def test_an_annotation_that_is_not_a_string_is_named() -> None:
    result = verdict({ANNOTATION: {"peakBytes": 1}}, gpu_spec(gpuMemory="32Gi"))
    assert result is not None and result.reason == gpu_memory.REASON_UNREADABLE and "not a string" in result.message


def test_the_record_round_trips() -> None:
    record = EstimateRecord(peak_bytes=40 * GiB, spec_hash="sha256:" + "a" * 64, gpu_memory_bytes=32 * GiB,
                            fits=False, suggestion=FIX)
    assert decode(record.encode()) == record
    assert json.loads(EstimateRecord(peak_bytes=1, spec_hash="sha256:" + "a" * 64).encode()) == {
        "peakBytes": 1, "specHash": "sha256:" + "a" * 64}


# --- At creation: the condition and one Warning Event --------------------------------------------------


BIG = (a_job("big").in_namespace("ml").with_uid("u-1").at_generation(1).with_nodes(2).with_spec(accelerator="gpu")
       .without_engine())
"""The job being accepted: two GPU nodes, training only."""


def test_at_creation_a_batch_that_does_not_fit_gets_the_condition_and_one_warning() -> None:
    spec = gpu_spec(gpuMemory="32Gi")
    estimate = annotation(spec, 40 * GiB, gpu_memory_bytes=32 * GiB, fits=False, suggestion=FIX)
    job = BIG.with_annotations(estimate).with_spec(gpuMemory="32Gi").as_model()
    first = compute_status(job, Observed(), None, NOW)
    condition = next(c for c in first.conditions if c.type == CONDITION)
    assert (condition.status, condition.reason) == ("True", gpu_memory.REASON_EXCEEDS)
    warnings = [e for e in status_events(None, first) if e.type == "Warning"]
    assert [(e.reason, e.message) for e in warnings] == [(CONDITION, condition.message)]
    # Later reconciles keep the condition and say nothing again; the job is not held back.
    again = compute_status(job.model_copy(update={"status": first}), Observed(), first, NOW)
    assert next(c for c in again.conditions if c.type == CONDITION) == condition
    assert not [e for e in status_events(first, again) if e.reason == CONDITION]
    assert again.phase == "Pending"


def test_an_annotation_written_after_creation_is_not_read() -> None:
    """At creation only: the check is of the spec as it was accepted."""
    first = compute_status(BIG.as_model(), Observed(), None, NOW)
    spec = gpu_spec(gpuMemory="32Gi")
    later = BIG.with_annotations(annotation(spec, 40 * GiB)).as_model()
    again = compute_status(later.model_copy(update={"status": first}), Observed(), first, NOW)
    assert not [c for c in again.conditions if c.type == CONDITION]


def test_a_condition_message_is_redacted() -> None:
    spec = gpu_spec(gpuMemory="32Gi")
    secret = "trainer.batchSize: 8 token=hunter2hunter2hunter2"
    estimate = annotation(spec, 40 * GiB, gpu_memory_bytes=32 * GiB, suggestion=secret)
    job = BIG.with_annotations(estimate).with_spec(gpuMemory="32Gi").as_model()
    condition = next(c for c in compute_status(job, Observed(), None, NOW).conditions if c.type == CONDITION)
    assert "hunter2" not in condition.message
