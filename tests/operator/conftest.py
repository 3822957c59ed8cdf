"""Fixtures of the operator tests: an API server with a cluster's worth of behaviour around it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from .cluster import Cluster, running_cluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path) as bench:
        yield bench


@pytest.fixture
async def operated(cluster: Cluster) -> AsyncIterator[Cluster]:
    """The cluster with one operator running (all namespaces)."""
    await cluster.start_operator()
    yield cluster
