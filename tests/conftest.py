"""Fixtures shared by every tier, each started once per session (per pytest worker) when a test asks for it:
the real S3 server (tests/s3server.py) and the real API server (tests/control_plane.py) with the CRD installed
(tests/kube_admission.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.control_plane import ControlPlane, started
from tests.kube_admission import KubeAdmission
from tests.s3server import S3Server


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The Versity S3 Gateway on 127.0.0.1 with a temporary data directory and made-up keys; stopped at the end."""
    server = S3Server.start_new(tmp_path_factory.mktemp("s3server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kube_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Upstream etcd and kube-apiserver on free ports, this checkout's CRD, and kube-controller-manager's garbage
    collector (children go with their owner) and service account controller (each namespace's `default`
    account); stopped at the end."""
    with started(tmp_path_factory.mktemp("kube-apiserver"), controllers="garbagecollector,serviceaccount",
                 with_crd=True) as plane:
        yield plane


@pytest.fixture(scope="session")
def admission(kube_apiserver: ControlPlane) -> KubeAdmission:
    """The CRD of this checkout installed in the session's kube-apiserver, which judges each object."""
    return KubeAdmission(kube_apiserver)
