"""`dtrain operator` as a command: its flags, its errors, /healthz, /metrics and JSON logs."""

from __future__ import annotations

import json
import subprocess
import sys

import aiohttp
import pytest

from dtrain_operator.cli import main as cli
from tests.builders import a_cpu_job

from .cluster import Cluster

NS = "default"
pytestmark = pytest.mark.real_apiserver


def run_dtrain(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dtrain_operator.cli", *args], capture_output=True, text=True, timeout=60, env=env,
        check=False,
    )


def test_help_documents_every_flag():
    parser = cli.build_parser()
    operator = next(a for a in parser._subparsers._group_actions[0].choices.items() if a[0] == "operator")[1]
    flags = [a for a in operator._actions if a.option_strings and a.dest != "help"]
    assert {f.option_strings[-1] for f in flags} == {
        "--namespace", "--all-namespaces", "--health-port", "--metrics-port", "--qps", "--burst",
        "--watch-timeout", "--stuck-terminating-timeout", "--image-pull-timeout", "--no-leader-elect", "--leader-elect-lease-duration",
        "--leader-elect-renew-deadline", "--leader-elect-retry-period", "--leader-elect-resource-name",
        "--leader-elect-resource-namespace", "--log-level", "--log-format", "--network-policy", "--refuse-host-access",
        "--report-service", "--report-port", "--report-tls-secret", "--service-account",
        "--trainer-service-account", "--allow-service-account", "--job-defaults",
    }
    text = run_dtrain("operator", "--help").stdout
    for flag in flags:
        assert flag.help and flag.option_strings[-1] in text


def test_no_credentials_is_one_clear_line(tmp_path):
    result = run_dtrain("operator", env={"KUBECONFIG": str(tmp_path / "missing"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 1
    assert "dtrain operator: no Kubernetes credentials" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_rate_limit_is_rejected():
    result = run_dtrain("operator", "--qps", "0")
    assert result.returncode == 2
    assert "--qps must be above 0" in result.stderr


def test_an_allowed_account_names_its_namespace():
    result = run_dtrain("operator", "--allow-service-account", "iam")
    assert result.returncode == 2
    assert "--allow-service-account 'iam': give it as NAMESPACE/NAME" in result.stderr


async def fetch(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, value = line.rsplit(" ", 1)
        found = dict(part.split("=", 1) for part in series[len(name) + 1 : -1].split(",") if "=" in part)
        if series.split("{")[0] == name and all(found.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    raise AssertionError(f"no {name} {labels} in /metrics")


async def test_health_and_metrics_endpoints(cluster: Cluster):
    operator = await cluster.start_operator("--log-format=json")
    await cluster.apply(a_cpu_job("measured").with_nodes(2).as_dict())
    await cluster.run_all(NS, "measured", 2)
    await cluster.phase(NS, "measured", "Running")
    await cluster.exit(NS, "measured-0", 1)
    await cluster.eventually(lambda: cluster.status(NS, "measured").get("restarts") == 1, "a restart")

    status, body = await fetch(f"http://127.0.0.1:{operator.health_port}/healthz")
    assert status == 200
    assert "reconcileQueue" in json.loads(body)

    async def scraped() -> str:
        return (await fetch(f"http://127.0.0.1:{operator.metrics_port}/metrics"))[1]

    text = await cluster.eventually(
        lambda: _restarting(scraped()), "dtrain_jobs{phase=Restarting} 1 in /metrics"
    )
    assert metric(text, "dtrain_jobs", phase="Running") == 0
    assert metric(text, "dtrain_gang_restarts_total") == 1
    assert metric(text, "dtrain_api_requests_total", verb="create", resource="pods", code="201") >= 2
    assert metric(text, "dtrain_reconcile_duration_seconds_count") > 0
    assert "dtrain_api_errors_total" in text

    lines = [line for line in operator.log.read_text().splitlines() if line.startswith("{")]
    assert lines and all("message" in json.loads(line) for line in lines)


async def _restarting(text_coroutine) -> str | None:
    text = await text_coroutine
    try:
        return text if metric(text, "dtrain_jobs", phase="Restarting") == 1 else None
    except AssertionError:
        return None
