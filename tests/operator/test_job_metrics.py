"""The operator process exports each job's progress from its status, restarts with their reason, and
every metric the chart's Grafana dashboard queries."""

from __future__ import annotations

import json
import re

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import a_cpu_job
from tests.chart.test_dashboard import DASHBOARD_FILE, METRIC_NAME

from .cluster import Cluster

NS = "default"
pytestmark = pytest.mark.real_apiserver


async def scrape(port: int) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        return await response.text()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def declared(text: str) -> set[str]:
    """Series names the registry declares, even before a labelled metric has its first sample."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update({f"{family.name}_total", f"{family.name}_bucket", f"{family.name}_count", f"{family.name}_sum"}
                     if family.type in ("counter", "histogram") else set())
        names.update(s.name for s in family.samples)
    return names


async def test_job_progress_and_restart_reasons_reach_metrics(cluster: Cluster):
    operator = await cluster.start_operator()
    await cluster.apply(a_cpu_job("measured").with_nodes(2).as_dict())
    await cluster.run_all(NS, "measured", 2)
    await cluster.phase(NS, "measured", "Running")
    await cluster.patch_job_status(NS, "measured", {"progress": {
        "epoch": 1, "step": 40, "loss": 0.31, "imagesPerSecond": 250.5, "metrics": {"val_acc": 0.97}}})
    job = (("job_name", "measured"), ("job_namespace", NS))

    async def reported() -> dict | None:
        found = samples(await scrape(operator.metrics_port))
        return found if found.get(("dtrain_job_loss", job)) == 0.31 else None

    found = await cluster.eventually(reported, "the job's loss in /metrics")
    assert found[("dtrain_job_images_per_second", job)] == 250.5
    assert found[("dtrain_job_step", job)] == 40
    assert found[("dtrain_job_epoch", job)] == 1
    assert found[("dtrain_job_metric", (*job, ("metric", "val_acc")))] == 0.97

    await cluster.exit(NS, "measured-1", 1)

    async def restarted() -> str | None:
        text = await scrape(operator.metrics_port)
        return text if samples(text).get(("dtrain_gang_restarts_total", (("reason", "WorkerFailed"),))) == 1 else None

    text = await cluster.eventually(restarted, "a gang restart with its reason in /metrics")
    assert samples(text)[("dtrain_job_restarts", job)] == 1
    names = declared(text)
    queried = set(METRIC_NAME.findall(DASHBOARD_FILE.read_text()))
    assert queried and queried <= names, f"the dashboard queries {sorted(queried - names)}, which are not exported"

    await cluster.delete(f"/apis/dtrain.dev/v1alpha1/namespaces/{NS}/distributedtrainings/measured")

    async def forgotten() -> bool:
        return not re.search(r'job_name="measured"', await scrape(operator.metrics_port))

    await cluster.eventually(forgotten, "the deleted job's series gone")
    assert json.loads(DASHBOARD_FILE.read_text())["uid"] == "dtrain-operator"
