"""A real S3 server for the tests: the Versity S3 Gateway (versitygw), built from its Go module (tools/s3server).

Not a mock: the trainer, the engine and s3fs talk S3 over HTTP to a server users run. It listens
on 127.0.0.1 only, keeps its objects in a temporary directory (one folder per bucket) and has one
root identity whose keys the tests make up. `stop()` and `start()` take it away and bring it back
on the same port and data, for the outage tests.

    server = S3Server.start_new(tmp_dir)      # builds .tools/bin/versitygw first if need be
    server.env()                              # AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, ... for a process
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "cluster"))

# tools/cluster is no installed package: its path is added above.
from localcluster import objectstore

from .ports import free_port

BUCKET = "dtrain-test"
START_TIMEOUT_SECONDS = 60


@dataclass
class S3Server:
    """One running gateway and how to reach it."""

    data_dir: Path
    port: int
    access_key: str = field(default_factory=lambda: "dtrain" + secrets.token_hex(6))
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start_new(cls, data_dir: Path) -> S3Server:
        objectstore.build()
        server = cls(data_dir, free_port())
        server.start()
        objectstore.create_bucket(server.endpoint, server.access_key, server.secret_key, BUCKET)
        return server

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What a client process needs: the endpoint, the region and the keys, as the operator sets them in a pod."""
        return objectstore.client_env(self.endpoint, self.access_key, self.secret_key)

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix.strip('/')}"

    @property
    def objects(self) -> Path:
        return self.data_dir / "objects"

    def start(self) -> None:
        self.objects.mkdir(parents=True, exist_ok=True)
        log = (self.data_dir / "versitygw.log").open("ab")
        self.process = subprocess.Popen(
            objectstore.gateway_argv(f"127.0.0.1:{self.port}", self.objects), stdout=log, stderr=subprocess.STDOUT,
            env=objectstore.gateway_env(self.access_key, self.secret_key), start_new_session=True,
        )
        try:
            objectstore.wait_until_answering(self.endpoint, lambda: self.process is not None and self.process.poll() is None,
                                             START_TIMEOUT_SECONDS, self.log_tail)
        except objectstore.ObjectStoreError:
            self.stop()
            raise

    def log_tail(self, lines: int = 20) -> str:
        path = self.data_dir / "versitygw.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
