"""A real S3 server for the tests: SeaweedFS's `weed mini`, built from its Go module (tools/s3server).

Not a mock: the trainer, the engine and s3fs talk S3 over HTTP to a server users run. It listens
on 127.0.0.1 only, keeps its data in a temporary directory, has one admin identity whose keys the
tests make up, and reports no telemetry (-master.telemetry=false). `stop()` and `start()` take it
away and bring it back on the same ports and data, for the outage tests.

    server = S3Server.start_new(tmp_dir)      # builds .tools/bin/weed first if need be
    server.env()                              # AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, ... for a process
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT / "tools" / "s3server" / "build.sh"
BINARY = ROOT / ".tools" / "bin" / "weed"
BUCKET = "dtrain-test"
REGION = "us-east-1"
# A cold build compiles SeaweedFS and its dependencies: minutes on two cores.
BUILD_TIMEOUT_SECONDS = 3600
START_TIMEOUT_SECONDS = 120
# weed's gRPC ports are its HTTP ports + 10000.
GRPC_OFFSET = 10000


def build() -> Path:
    """The server binary, built (once; Go's caches make a rebuild quick) from tools/s3server."""
    subprocess.run(["bash", str(BUILD_SCRIPT), str(BINARY)], check=True, timeout=BUILD_TIMEOUT_SECONDS)
    return BINARY


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """`count` ports p, each with p + 10000 free too, in a range far from the servers' defaults."""
    ports: list[int] = []
    rng = secrets.SystemRandom()
    while len(ports) < count:
        port = rng.randrange(20000, 30000)
        if port not in ports and _free(port) and _free(port + GRPC_OFFSET):
            ports.append(port)
    return ports


@dataclass
class S3Server:
    """One running `weed mini` and how to reach it."""

    data_dir: Path
    ports: dict[str, int]
    access_key: str = field(default_factory=lambda: "dtrain" + secrets.token_hex(6))
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start_new(cls, data_dir: Path) -> S3Server:
        build()
        names = ("master", "volume", "filer", "s3", "admin")
        server = cls(data_dir, dict(zip(names, _free_ports(len(names)), strict=True)))
        server.start()
        return server

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def env(self) -> dict[str, str]:
        """What a client process needs: the endpoint, the region and the keys, as the operator sets them in a pod."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix.strip('/')}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            str(BINARY), "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={self.ports['master']}", f"-volume.port={self.ports['volume']}",
            f"-filer.port={self.ports['filer']}", f"-s3.port={self.ports['s3']}",
            f"-admin.port={self.ports['admin']}", "-admin.port.legacy=0",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
            "-master.telemetry=false", f"-bucket={BUCKET}",
        ]
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.data_dir),
               "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        log = (self.data_dir / "weed.log").open("ab")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until the bucket answers an (unsigned, so refused) request with an S3 reply, not a connection error."""
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.process.returncode}: {self.log_tail()}")
            if self._bucket_answers():
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"weed mini did not serve S3 within {START_TIMEOUT_SECONDS} s: {self.log_tail()}")

    def _bucket_answers(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.endpoint}/{BUCKET}", timeout=2)
        except urllib.error.HTTPError as error:
            return error.code in (403, 404, 200)
        except OSError:
            return False
        return True

    def log_tail(self, lines: int = 20) -> str:
        path = self.data_dir / "weed.log"
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
