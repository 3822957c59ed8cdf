"""Free-form fields the API server stores as given (`initArgs` is x-kubernetes-preserve-unknown-fields):
a hostile value is an InvalidSpec condition naming the field, never a crashed reconcile."""

from __future__ import annotations

import pytest

from tests.builders import a_cpu_job

from .cluster import Cluster

NS = "default"
pytestmark = pytest.mark.real_apiserver


def _nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


async def test_deep_init_args_fail_the_job_cleanly(operated: Cluster):
    deep = {"classPath": "m.M", "initArgs": _nested(300)}
    await operated.apply(a_cpu_job("deep").with_nodes(1).with_spec(model=deep).as_dict())
    await operated.phase(NS, "deep", "Failed")
    failed = operated.condition(NS, "deep", "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.model.initArgs: is nested deeper than 32 levels" in failed["message"]
    assert operated.pods(NS, "deep") == []
    # The operator goes on with other jobs.
    await operated.apply(a_cpu_job("fine").with_nodes(1).as_dict())
    await operated.eventually(lambda: len(operated.pods(NS, "fine")) == 1, "the next job's pod")


async def test_huge_init_args_fail_the_job_cleanly(operated: Cluster):
    wide = {f"k{i}": i for i in range(20_000)}
    wide_data = {"classPath": "m.D", "initArgs": wide}
    await operated.apply(a_cpu_job("wide").with_nodes(1).with_spec(data=wide_data).as_dict())
    await operated.phase(NS, "wide", "Failed")
    message = operated.condition(NS, "wide", "Failed")["message"]
    assert "spec.data.initArgs: holds more than 10000 values" in message
    assert len(message) < 2000
