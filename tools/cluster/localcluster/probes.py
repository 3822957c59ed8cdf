"""The readiness probe, as a kubelet runs it: httpGet and tcpSocket from the node, the pod Ready after
`successThreshold` successes and not after `failureThreshold` failures."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from .podrun import PodRun
from .podstatus import StatusManager, container_statuses, pod_conditions


async def probe_readiness(run: PodRun, probe: dict[str, Any], status: StatusManager) -> None:
    """httpGet and tcpSocket readiness probes, from the node, as a kubelet probes."""
    await asyncio.sleep(probe.get("initialDelaySeconds", 0))
    ports = {p.get("name"): p["containerPort"] for p in run.container.get("ports") or []}
    successes = failures = 0
    while True:
        ok = await probe_once(run, probe, ports)
        successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
        ready = (run.ready or successes >= probe.get("successThreshold", 1)) and failures < probe.get(
            "failureThreshold", 3)
        if ready != run.ready:
            run.ready = ready
            await status.patch(run, {
                "conditions": pod_conditions(run, True),
                "containerStatuses": container_statuses(run, {"running": {"startedAt": run.started_at}}),
            })
        await asyncio.sleep(probe.get("periodSeconds", 10))


async def probe_once(run: PodRun, probe: dict[str, Any], ports: dict[Any, int]) -> bool:
    assert run.net is not None
    action = probe.get("httpGet") or probe.get("tcpSocket")
    if action is None:
        return True  # exec probes: no exec here; said in the module docstring
    port = action["port"]
    port = ports.get(port, port) if isinstance(port, str) else port
    timeout = probe.get("timeoutSeconds", 1)
    try:
        if "httpGet" in probe:
            url = f"http://{run.net.address}:{port}{action.get('path', '/')}"
            async with aiohttp.ClientSession() as session, session.get(
                    url, timeout=aiohttp.ClientTimeout(total=timeout)) as reply:
                return 200 <= reply.status < 400
        _, writer = await asyncio.wait_for(asyncio.open_connection(run.net.address, port), timeout)
        writer.close()
        return True
    except (OSError, aiohttp.ClientError, asyncio.TimeoutError):
        return False
