"""Helpers for the trainer tests: configs, real trainer processes, and a tiny Kubernetes API stand-in.

Every training run here is a real process (`python -m dtrain_trainer`, or torchrun
starting it), with OMP_NUM_THREADS=1 and tiny models so that the suite stays short on
two shared cores.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from dtrain_operator.api import contract

USER_CODE = Path(__file__).parent / "user_code"
USER_MODEL = "dtrain_test_user.TinyClassifier"
USER_DATA = "dtrain_test_user.RandomImageData"
RUN_TIMEOUT_SECONDS = 240


def trainer_config(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    """A TrainerConfig (wire format) for a tiny CPU run in tmp_path; `sections` replace or extend its parts."""
    config: dict[str, Any] = {
        "jobName": "test-job",
        "accelerator": "cpu",
        "nodes": 1,
        "devicesPerNode": 1,
        "model": {"classPath": USER_MODEL, "initArgs": {}},
        "data": {"classPath": USER_DATA, "initArgs": {}},
        "trainer": {"maxSteps": 4, "batchSize": 8, "numWorkers": 0, "logEveryNSteps": 1, "precision": "32-true"},
        "checkpoint": {"dir": str(tmp_path / "checkpoints"), "everyNSteps": 2, "keepLast": 2},
        "artifacts": {"dir": str(tmp_path / "artifacts")},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def write_config(tmp_path: Path, config: dict[str, Any], name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a trainer process: this one, minus anything a launcher would set, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not contract.is_reserved_env_name(k) and k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(USER_CODE), *filter(None, [os.environ.get("PYTHONPATH")])])
    env[contract.ENV_PROGRESS_INTERVAL] = "0"
    env.update(extra)
    return env


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def run_trainer(config_path: Path, timeout: float = RUN_TIMEOUT_SECONDS, **env: str) -> Run:
    """`python -m dtrain_trainer --config FILE` as one process, without torchrun."""
    done = subprocess.run(
        [sys.executable, "-m", "dtrain_trainer", "--config", str(config_path)],
        env=process_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout, check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Request:
    method: str
    path: str
    content_type: str
    body: Any


@dataclass
class FakeApiServer:
    """A stand-in for the Kubernetes API server's status endpoint, over real HTTP.

    It records every request; `status` is the reply code; `release` must be set before
    a request gets its reply (so a test can hold the server still).
    """

    url: str
    requests: list[Request] = field(default_factory=list)
    status: int = 200
    release: threading.Event = field(default_factory=threading.Event)

    def kubeconfig(self, directory: Path) -> Path:
        path = directory / "kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "test", "cluster": {"server": self.url}}],
                    "users": [{"name": "test", "user": {"token": "test-token"}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
                    "current-context": "test",
                }
            )
        )
        return path


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    server_state: dict[str, FakeApiServer] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            state = server_state["server"]
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"null")
            state.requests.append(Request("PATCH", self.path, self.headers.get("Content-Type", ""), body))
            state.release.wait(30)
            reply = json.dumps({"apiVersion": contract.API_VERSION, "kind": contract.KIND, **(body or {})}).encode()
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state = FakeApiServer(url=f"http://127.0.0.1:{httpd.server_address[1]}")
    state.release.set()
    server_state["server"] = state
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield state
    state.release.set()
    httpd.shutdown()
    httpd.server_close()


class ListSink:
    """A progress sink that keeps every record, to assert on what rank 0 reported."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def send(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))

    def close(self) -> None:
        pass
