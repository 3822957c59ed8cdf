"""Fixtures of the operator tests: an API server (the real one, or the emulator where a test needs its faults)
with a cluster's worth of behaviour around it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from .cluster import Cluster, running_cluster
from .real_cluster import running_real_cluster


@pytest.fixture
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    """The session's real API server for a module marked `real_apiserver` (real_cluster.py), else the emulator:
    for a test marked `emulator` (with what it needs of it), and for the modules not moved yet."""
    if request.node.get_closest_marker("real_apiserver") and not request.node.get_closest_marker("emulator"):
        plane, admission = request.getfixturevalue("kube_apiserver"), request.getfixturevalue("admission")
        async with running_real_cluster(plane, admission, tmp_path) as real:
            yield real
        return
    async with running_cluster(tmp_path) as bench:
        yield bench


@pytest.fixture
async def operated(cluster: Cluster) -> AsyncIterator[Cluster]:
    """The cluster with one operator running (all namespaces)."""
    await cluster.start_operator()
    yield cluster
