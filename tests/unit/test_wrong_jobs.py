"""The wrong-jobs corpus (tests/corpus): `dtrain validate`'s offline verdict on each case, in team-a
with the job defaults `make cluster` sets, every message short and every check quick enough for a
reconcile. What only the API server can tell (`# expect: server`) is the operator's dry run's, checked
on the real server by `make e2e`'s scenario `wrong-jobs`."""

from __future__ import annotations

import pytest

from dtrain_operator.api.job_defaults import JobDefaults
from dtrain_operator.api.validation import validate_text
from tests.corpus import MAX_MESSAGE_BYTES, Case, load_cases

CASES = load_cases()
# As `make cluster` sets them for team-a (tools/cluster/localcluster: job_defaults).
DEFAULTS = JobDefaults(
    spec={"image": "localhost/dtrain/dtrain-trainer:test",
          "engine": {"image": "localhost/dtrain/dtrain-engine:test", "fallback": "onnxruntime"}},
    namespaces={"team-a": {"storage": {"claimName": "dtrain-shared"}}},
)


def test_the_corpus_covers_every_verdict():
    assert {case.verdict for case in CASES} == {"refused", "server", "accepted"}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_validate_gives_each_case_its_verdict(case: Case):
    result = validate_text(case.text, case.id, cluster=True, defaults=DEFAULTS, namespace="team-a")
    message = "\n".join(result.errors)
    assert len(message.encode()) < MAX_MESSAGE_BYTES, f"{len(message.encode())} bytes: {message[:500]}"
    if case.verdict == "refused":
        assert result.job is None, "accepted, but it must be refused"
        assert case.needle in message, message
    else:
        assert result.job is not None and not result.errors, message
