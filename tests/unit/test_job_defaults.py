"""Job defaults (api/job_defaults.py): a job's own fields win, objects merge key by key except those taken
whole, per-namespace defaults lie over the rest; a bad defaults file is named by field; the operator fills an
accepted job from the spec it accepted, so that defaults changed since are no edit of it (core/accepted.py)."""

from __future__ import annotations

import pytest

from dtrain_operator.api import DistributedTrainingStatus, immutable_spec
from dtrain_operator.api.job_defaults import JobDefaults, JobDefaultsError, with_defaults
from dtrain_operator.api.validation import parse_job_defaults
from dtrain_operator.core.accepted import changed_immutable_fields, parse_job
from tests.builders import a_cpu_job

DEFAULTS = {"image": "registry.example.com/trainer:1", "storage": {"claimName": "dtrain-shared"},
            "engine": {"image": "registry.example.com/engine:1", "fallback": "onnxruntime"},
            "trainer": {"numWorkers": 4}}


def test_a_jobs_own_fields_win_and_objects_merge_key_by_key():
    spec = {"nodes": 2, "engine": {"precision": "fp16"}, "trainer": {"numWorkers": 0}, "image": None}
    assert with_defaults(spec, DEFAULTS) == {
        "nodes": 2, "image": "registry.example.com/trainer:1", "storage": {"claimName": "dtrain-shared"},
        "engine": {"image": "registry.example.com/engine:1", "fallback": "onnxruntime", "precision": "fp16"},
        "trainer": {"numWorkers": 0},
    }


def test_one_choice_is_taken_whole():
    """A bucket in the job and a claim in the defaults is the job's bucket, not both (which no spec may hold)."""
    merged = with_defaults({"storage": {"url": "s3://bucket/jobs"}, "model": {"classPath": "my.Model"}},
                           {**DEFAULTS, "model": {"classPath": "other.Model", "initArgs": {"depth": 50}}})
    assert merged["storage"] == {"url": "s3://bucket/jobs"} and merged["model"] == {"classPath": "my.Model"}


def test_a_namespaces_defaults_lie_over_everyones():
    defaults = JobDefaults(spec=DEFAULTS, namespaces={"team-b": {"storage": {"url": "gs://team-b/jobs"}}})
    assert defaults.for_namespace("team-a")["storage"] == {"claimName": "dtrain-shared"}
    assert defaults.for_namespace("team-b")["storage"] == {"url": "gs://team-b/jobs"}
    filled = defaults.fill(a_cpu_job("filled").in_namespace("team-b").without_storage().as_dict())
    assert filled["spec"]["storage"] == {"url": "gs://team-b/jobs"} and filled["spec"]["image"] == DEFAULTS["image"]


def test_the_file_is_checked_as_a_spec_is():
    parsed = parse_job_defaults("spec:\n  image: registry.example.com/trainer:1\nnamespaces:\n  team-a: {nodes: 2}\n")
    assert parsed.for_namespace("team-a") == {"image": "registry.example.com/trainer:1", "nodes": 2}
    assert parse_job_defaults("") == JobDefaults()
    with pytest.raises(JobDefaultsError, match=r"^jobDefaults\.namespaces\.team-a\.nodes"):
        parse_job_defaults("namespaces:\n  team-a: {nodes: 0}\n")
    with pytest.raises(JobDefaultsError, match="expected a mapping with spec and namespaces"):
        parse_job_defaults("image: x\n")


def test_an_accepted_job_is_filled_from_what_it_was_accepted_with():
    body = a_cpu_job("resnet").without_storage().with_nodes(2).as_dict()
    first = parse_job(body, DistributedTrainingStatus(), DEFAULTS)
    assert first.job is not None and first.job.spec.image == DEFAULTS["image"]
    accepted = DistributedTrainingStatus(accepted_spec=immutable_spec(first.job.spec))
    later = parse_job(body, accepted, {**DEFAULTS, "image": "registry.example.com/trainer:2"})
    assert later.job is not None and later.job.spec.image == DEFAULTS["image"]
    assert changed_immutable_fields(later.job.model_copy(update={"status": accepted})) == []
    refused = parse_job(body, DistributedTrainingStatus(), {})
    assert refused.job is None and "spec.storage: the job has no shared storage" in refused.errors[0]


def test_removing_a_field_the_defaults_do_not_set_is_still_an_edit():
    body = a_cpu_job("resnet").without_storage().with_nodes(2).with_spec(nccl={"debug": "INFO"}).as_dict()
    first = parse_job(body, DistributedTrainingStatus(), DEFAULTS)
    assert first.job is not None
    accepted = DistributedTrainingStatus(accepted_spec=immutable_spec(first.job.spec))
    del body["spec"]["nccl"]
    later = parse_job(body, accepted, DEFAULTS)
    assert later.job is not None
    assert changed_immutable_fields(later.job.model_copy(update={"status": accepted})) == ["spec.nccl.debug"]
