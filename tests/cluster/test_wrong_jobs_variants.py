"""The e2e scenario wrong-jobs' generated variants are working jobs as `dtrain validate` sees them in team-a,
with unique names: what the scenario finds refused is the API server's or the operator's doing."""

from __future__ import annotations

from dtrain_operator.api.validation import validate_object
from tests.unit.test_wrong_jobs import DEFAULTS

from .wrong_jobs import NS, generated_variants


def test_every_generated_variant_validates_and_has_its_own_name():
    variants = list(generated_variants())
    assert len({name for name, _ in variants}) == len(variants) >= 100
    for name, job in variants:
        result = validate_object(DEFAULTS.fill({**job, "metadata": {**job["metadata"], "namespace": NS}}, NS), name)
        assert not result.errors, (name, result.errors)
