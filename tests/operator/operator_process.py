"""`dtrain operator` as a real process for the operator's test bench (cluster.py): its kubeconfig,
pointing at the test API server, and the process, started, stopped or killed as in its Deployment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ..ports import free_port

OPERATOR_AGENTS = ("kopf/", "dtrain-operator/")
# Where the chart (helm template's defaults) puts the operator's service account.
OPERATOR_NAMESPACE = "dtrain-system"


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: emulator
  cluster: {{server: "{server}"}}
users:
- name: operator
  user: {{token: test-token}}
contexts:
- name: emulator
  context: {{cluster: emulator, user: operator, namespace: default}}
current-context: emulator
"""
    )
    return path


class OperatorProcess:
    """`dtrain operator` in its own process, as in its Deployment; killable with SIGKILL."""

    def __init__(
        self, kubeconfig: Path, log: Path, args: tuple[str, ...] = (), pod_id: str = "dtrain-operator-test"
    ) -> None:
        self.pod_id = pod_id  # its leader-election identity (a Deployment's pod name)
        self.kubeconfig = kubeconfig
        self.log = log
        self.args = args
        self.health_port = free_port()
        self.metrics_port = free_port()
        # The report endpoint as the chart starts it (its TLS Secret, the pods' token volume and CA);
        # rank 0's reports themselves need the API server's TokenReview: make e2e's scenario `tokens`.
        self.report_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env.update(
            KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1", POD_ID=self.pod_id, POD_NAMESPACE=OPERATOR_NAMESPACE
        )
        command = [
            sys.executable,
            "-m",
            "dtrain_operator.cli",
            "operator",
            f"--health-port={self.health_port}",
            f"--metrics-port={self.metrics_port}",
            "--report-service=dtrain-operator",
            f"--report-port={self.report_port}",
            "--qps=500",
            "--burst=500",
            "--watch-timeout=20",
            "--log-level=DEBUG",
            *self.args,
        ]
        if not any(a.startswith(("--namespace", "-n")) for a in self.args):
            command.append("--all-namespaces")
        log = self.log.open("ab")
        log.write(f"\n=== start: {' '.join(command[3:])}\n".encode())
        log.flush()
        self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye, as a node failure or an OOM kill."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)

    def log_tail(self, lines: int = 60) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
