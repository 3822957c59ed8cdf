"""Fixtures shared by every tier: the real S3 server (tests/s3server.py), started once per session when a test asks for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.s3server import S3Server


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The Versity S3 Gateway on 127.0.0.1 with a temporary data directory and made-up keys; stopped at the end."""
    server = S3Server.start_new(tmp_path_factory.mktemp("s3server"))
    try:
        yield server
    finally:
        server.stop()
