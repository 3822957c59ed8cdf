"""Planted credentials stay where the user put them: never in the ConfigMap, the status (the
operator's record of the job), an Event or the operator's log.

The worker pods carry the env values (a pod spec is where they belong, and `valueFrom` is
the way to keep them out of it); everything else dtrain writes is readable by the `view` role.
"""

from __future__ import annotations

import json

import pytest

from dtrain_operator.api import contract
from tests.builders import a_cpu_job

from .cluster import Cluster

NS = "default"
pytestmark = pytest.mark.real_apiserver
ENV_SECRET = "s3cr3t-value-in-env-1234"
LOG_TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123"
BEARER = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
PLANTED = (ENV_SECRET, LOG_TOKEN, BEARER)


def _everything_but_pods(operated: Cluster) -> str:
    texts = [json.dumps(operated.job(NS, "leaky"))]
    for resource in ("v1/configmaps", "v1/events", "v1/services", "batch/v1/jobs"):
        texts.append(json.dumps(operated.objects(resource, NS)))
    texts.append(operated.logs())
    return "\n".join(texts)


async def test_planted_credentials_never_leave_the_pod(operated: Cluster):
    job = (a_cpu_job("leaky").with_nodes(2).with_backoff_limit(1)
           .with_spec(env=[{"name": "HF_TOKEN", "value": ENV_SECRET}]).as_dict())
    await operated.apply(job)
    await operated.run_all(NS, "leaky", 2)
    await operated.phase(NS, "leaky", "Running")
    # The pods need the value; everything else must do without it.
    env = operated.pod(NS, "leaky-0")["spec"]["containers"][0]["env"]
    assert {"name": "HF_TOKEN", "value": ENV_SECRET} in env
    # A trainer that prints credentials in its last log lines, which become the pod's message.
    message = f"Traceback ...\nRuntimeError: login failed with token={LOG_TOKEN}\nAuthorization: Bearer {BEARER}"
    await operated.exit(NS, "leaky-1", 1, message)
    restarting = await operated.eventually(
        lambda: (c := operated.condition(NS, "leaky", "Restarting")) and c["status"] == "True" and c, "Restarting"
    )
    assert "login failed with token=***" in restarting["message"]
    await operated.eventually(lambda: "Restarting" in [e["reason"] for e in operated.events(NS, "leaky")], "the event")

    status = operated.status(NS, "leaky")
    assert status["acceptedSpec"]["env"] == [{"name": "HF_TOKEN", "value": "(in spec.env)"}]
    seen = _everything_but_pods(operated)
    # The user's own spec holds the value they wrote; the copies and the messages do not.
    seen = seen.replace(json.dumps({"name": "HF_TOKEN", "value": ENV_SECRET}), "")
    for planted in PLANTED:
        assert planted not in seen, f"{planted[:12]}... leaked"

    # The next gang still gets the real value, from the spec.
    pods = await operated.eventually(
        lambda: len(p := operated.pods(NS, "leaky")) == 2
        and {q["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for q in p} == {"1"} and p,
        "the second gang",
    )
    for pod in pods:
        assert {"name": "HF_TOKEN", "value": ENV_SECRET} in pod["spec"]["containers"][0]["env"]
