"""The operator's own record of a job, and reading a status that others write too."""

from __future__ import annotations

import json

import pytest

from dtrain_operator.api import DistributedTrainingStatus, contract
from dtrain_operator.api.job import spec_hash
from dtrain_operator.api.record_patches import MAX_TRAINER_FIELD_BYTES
from dtrain_operator.controller import trusted

SPEC = {"image": "registry.example/trainer:1", "nodes": 2}
KEY = bytes(range(32))
JOB = trusted.JobIdentity("team-a", "x", "0b3c-uid")


def body(state: trusted.TrustedState | None = None, status=None, annotation=None, job=JOB) -> dict:
    annotations = {}
    if state is not None:
        annotations[contract.ANNOTATION_STATE] = state.encode(KEY, JOB)
    if annotation is not None:
        annotations[contract.ANNOTATION_STATE] = annotation
    meta = {"namespace": job.namespace, "name": job.name, "uid": job.uid, "annotations": annotations}
    return {"metadata": meta, "status": status}


def test_a_record_reads_back_as_written():
    state = trusted.TrustedState(SPEC, restarts=3, phase="Running", start_time="2026-01-01T00:00:00Z")
    assert trusted.read_state(body(state), KEY) == state
    assert trusted.read_state(body(), KEY) is None


def forged(spec: dict, **fields) -> str:
    """A record as a user would write it, with every field the operator writes and the version 1 hash."""
    record = {"version": trusted.VERSION, "restarts": 0, "phase": None, "startTime": None, "completionTime": None,
              "succeededRanks": [], "acceptedSpec": spec, "specHash": spec_hash(spec), **fields}
    return json.dumps(record)


HOST_ACCESS = {**SPEC, "hostNetwork": True, "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}


@pytest.mark.parametrize(
    "annotation",
    [
        forged(HOST_ACCESS),
        forged(HOST_ACCESS, signature=""),
        forged(HOST_ACCESS, signature="0" * 64),
        # Signed with a key of the user's own choosing.
        trusted.TrustedState(HOST_ACCESS).encode(b"user-chosen key", JOB),
    ],
)
def test_a_record_a_user_wrote_is_never_believed(annotation):
    with pytest.raises(trusted.UntrustedState, match="signature does not verify"):
        trusted.read_state(body(annotation=annotation), KEY)


@pytest.mark.parametrize(
    "other", [trusted.JobIdentity("team-a", "y", JOB.uid), trusted.JobIdentity("team-b", "x", JOB.uid),
              trusted.JobIdentity("team-a", "x", "a-new-uid")],
    ids=["another job", "another namespace", "the same name created again"],
)
def test_a_signed_record_is_worthless_on_another_job(other):
    signed = trusted.TrustedState(HOST_ACCESS, restarts=1).encode(KEY, JOB)
    with pytest.raises(trusted.UntrustedState, match="signature does not verify"):
        trusted.read_state(body(annotation=signed, job=other), KEY)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda r: r["acceptedSpec"].update(image="attacker/evil:1"), "signature does not verify"),
        (lambda r: r.update(restarts=7), "signature does not verify"),
        (lambda r: r.update(version=1), "version 1"),
    ],
)
def test_a_record_not_written_by_this_operator_is_not_trusted(edit, message):
    record = json.loads(trusted.TrustedState(SPEC, restarts=2).encode(KEY, JOB))
    edit(record)
    with pytest.raises(trusted.UntrustedState, match=message):
        trusted.read_state(body(annotation=json.dumps(record)), KEY)
    with pytest.raises(trusted.UntrustedState, match="not JSON"):
        trusted.read_state(body(annotation="{"), KEY)


def test_the_record_decides_over_the_status():
    read = DistributedTrainingStatus.model_validate(
        {"phase": "Succeeded", "restarts": 0, "acceptedSpec": {"image": "attacker/evil:1"}, "progress": {"step": 4}}
    )
    state = trusted.TrustedState(SPEC, restarts=2, phase="Running", start_time="2026-01-01T00:00:00Z")
    previous = trusted.trusted_previous(read, state)
    assert (previous.accepted_spec, previous.restarts, previous.phase) == (SPEC, 2, "Running")
    assert previous.progress is not None and previous.progress.step == 4


def test_without_a_record_a_job_starts_afresh_from_its_pods_generation():
    read = DistributedTrainingStatus.model_validate({"phase": "Running", "restarts": 0, "acceptedSpec": {"image": "e"}})
    previous = trusted.trusted_previous(read, None, [1, 2])
    assert (previous.accepted_spec, previous.phase, previous.restarts) == (None, None, 2)


def test_an_unreadable_field_is_named_and_the_rest_is_read():
    read = trusted.read_status(body(status={"phase": "Running", "restarts": 1, "nodes": {"total": "three"}}))
    assert read.status.phase == "Running" and read.status.nodes is None
    assert len(read.problems) == 1 and read.problems[0].startswith("status.nodes.total:")
    assert '"three"' in read.problems[0]


@pytest.mark.parametrize(("field", "unreadable"), [
    ("progress", {"step": "three"}), ("preflight", {"worldSize": "three"}), ("lastCheckpoint", {"step": "three"}),
    ("hangStacks", {"step": "three"}),
])
def test_the_trainers_fields_over_their_bound_or_unreadable_are_read_as_absent(field, unreadable):
    """What a worker reported never freezes the job: the operator decides on without it."""
    huge = {"stage": "x" * (MAX_TRAINER_FIELD_BYTES + 1)}
    for value in (huge, unreadable):
        read = trusted.read_status(body(status={"phase": "Running", field: value}))
        assert read.problems == () and getattr(read.status, {"lastCheckpoint": "last_checkpoint",
                                                             "hangStacks": "hang_stacks"}.get(field, field)) is None
        assert read.status.phase == "Running"


def test_a_status_that_is_not_an_object_is_a_problem():
    assert trusted.read_status(body(status="broken")).problems
    assert trusted.read_status(body(status=None)).problems == ()
