"""Free-form fields the API server stores as given (`initArgs` is x-kubernetes-preserve-unknown-fields):
a hostile value is an InvalidSpec condition naming the field, never a crashed reconcile."""

from __future__ import annotations

from .cluster import Cluster, a_job

NS = "default"


def _nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


async def test_deep_init_args_fail_the_job_cleanly(operated: Cluster):
    await operated.apply(a_job("deep").nodes(1).with_spec("model", {"classPath": "m.M", "initArgs": _nested(300)}).build())
    await operated.phase(NS, "deep", "Failed")
    failed = operated.condition(NS, "deep", "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.model.initArgs: is nested deeper than 32 levels" in failed["message"]
    assert operated.pods(NS, "deep") == []
    # The operator goes on with other jobs.
    await operated.apply(a_job("fine").nodes(1).build())
    await operated.eventually(lambda: len(operated.pods(NS, "fine")) == 1, "the next job's pod")


async def test_huge_init_args_fail_the_job_cleanly(operated: Cluster):
    wide = {f"k{i}": i for i in range(20_000)}
    await operated.apply(a_job("wide").nodes(1).with_spec("data", {"classPath": "m.D", "initArgs": wide}).build())
    await operated.phase(NS, "wide", "Failed")
    message = operated.condition(NS, "wide", "Failed")["message"]
    assert "spec.data.initArgs: holds more than 10000 values" in message
    assert len(message) < 2000
