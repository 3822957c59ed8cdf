"""Fixtures of the client and CLI tests: the operator tests' API server, serving pods/log too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ..operator.cluster import Cluster
from ..operator.pod_logs import running_cluster_with_logs


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with running_cluster_with_logs(tmp_path) as bench:
        yield bench
