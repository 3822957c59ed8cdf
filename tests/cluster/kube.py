"""The scenarios' view of the cluster: kubectl with the admin kubeconfig or a user's own credentials,
objects as JSON, waiting, and the kubelet's side of a pod (its processes, by the pod's UID)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from localcluster import layout, pki

REPO = Path(__file__).resolve().parents[2]

KUBECTL = REPO / ".tools" / "bin" / "kubectl"
LOCALCLUSTER = [sys.executable, "-m", "localcluster"]
T = TypeVar("T")


class Failed(AssertionError):
    pass


def localcluster(*args: str) -> int:
    """`python -m localcluster ARGS` from tools/cluster, as make cluster runs it: its exit status."""
    # E2E_PODS_FROM=host: containers from this machine's environment, for quick local loops.
    env = {**os.environ, "PODS_FROM": os.environ.get("E2E_PODS_FROM") or "images"}
    return subprocess.run([*LOCALCLUSTER, *args], cwd=REPO / "tools" / "cluster", check=False, env=env).returncode


def kubectl(*args: str, kubeconfig: Path = layout.KUBECONFIG, stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(KUBECTL), f"--kubeconfig={kubeconfig}", *args], input=stdin, text=True,
                            capture_output=True, check=False, timeout=120)
    if check and result.returncode != 0:
        raise Failed(f"kubectl {' '.join(args)}: {(result.stderr or result.stdout).strip()}")
    return result


def get(kind: str, name: str = "", namespace: str = layout.JOB_NAMESPACE) -> Any:
    result = kubectl("get", kind, *([name] if name else []), "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        return None
    return json.loads(result.stdout)


def items(kind: str, namespace: str = layout.JOB_NAMESPACE, selector: str = "") -> list[dict[str, Any]]:
    args = ["get", kind, "-n", namespace, "-o", "json"] + (["-l", selector] if selector else [])
    return json.loads(kubectl(*args).stdout)["items"]


def apply(obj: dict[str, Any], kubeconfig: Path = layout.KUBECONFIG, check: bool = True) -> subprocess.CompletedProcess[str]:
    return kubectl("apply", "-f", "-", kubeconfig=kubeconfig, stdin=json.dumps(obj), check=check)


def eventually(check: Callable[[], T], what: str, timeout: float = 120.0, every: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def status(name: str, namespace: str = layout.JOB_NAMESPACE) -> dict[str, Any]:
    job = get("distributedtraining", name, namespace)
    return (job or {}).get("status") or {}


def worker_pods(name: str, namespace: str = layout.JOB_NAMESPACE) -> list[dict[str, Any]]:
    return items("pods", namespace, f"dtrain.dev/job-name={name},dtrain.dev/role=worker")


def user_kubeconfig(user: str, groups: tuple[str, ...] = ()) -> Path:
    """A kubeconfig with a client certificate of `user` (a person, as an identity provider would name one)."""
    name = f"user-{user}"
    subject_group = groups[0] if groups else None
    cert, key = pki.client(name, user, subject_group)
    return pki.kubeconfig(layout.PKI / f"{name}.kubeconfig", user, cert, key)


def token_kubeconfig(name: str, token: str) -> Path:
    ca_cert, _ = pki.ca()
    path = layout.PKI / f"token-{name}.kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": layout.APISERVER_URL, "certificate-authority": str(ca_cert)}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "current-context": "c",
    }))
    path.chmod(0o600)
    return path


def request_with_token(token: str | None, method: str, path: str, body: Any = None) -> tuple[int, str]:
    """One API request with a bearer token, as a pod's client sends it (None: an anonymous one): (HTTP status, body)."""
    context = ssl.create_default_context(cafile=str(pki.ca()[0]))
    headers = {"Content-Type": "application/merge-patch+json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(layout.APISERVER_URL + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def pod_processes(pod: dict[str, Any]) -> list[int]:
    """The machine's PIDs of a pod's processes: the `unshare` whose podinit spec names the pod's folder,
    then everything under it (the container's PID 1, which no longer names the spec once it is the
    container's command, and its children), parents before children."""
    uid = pod["metadata"]["uid"][:8]
    todo = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"_{uid}/podinit.json".encode() in cmdline:
            todo.append(int(proc.name))
    found: list[int] = []
    while todo:
        pid = todo.pop(0)
        if pid in found:
            continue  # podinit before its exec: a child of unshare that names the spec too
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        found.append(pid)
        todo.extend(int(c) for c in children)
    return found


def trainer_pids(pod: dict[str, Any]) -> list[int]:
    """The rank processes torchrun started in the pod (the training itself)."""
    pids = []
    for pid in pod_processes(pod):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        # Not torchrun (dtrain_trainer.launch) nor the pod's supervisor around it: the ranks.
        if b"-m dtrain_trainer" in cmdline and b"launch" not in cmdline and b"supervisor" not in cmdline:
            pids.append(pid)
    return pids


def pod_netns(pod: dict[str, Any]) -> str:
    """The network namespace the kubelet made for a pod (named after its address, network.py)."""
    _, _, node, index = pod["status"]["podIP"].split(".")
    return f"{layout.NETNS_PREFIX}{node}-{index}"


def link(pod: dict[str, Any], up: bool) -> None:
    """The pod's link up or down (a cut cable, a dead switch port)."""
    subprocess.run(["ip", "-n", pod_netns(pod), "link", "set", "eth0", "up" if up else "down"], check=True)


def throttle(pod: dict[str, Any], megabits_per_second: int) -> None:
    """The pod sends at most this fast: a token bucket (`tc tbf`) on its eth0 (netem needs sch_netem,
    which not every kernel has); the queue is long enough that nothing is lost."""
    subprocess.run(["ip", "netns", "exec", pod_netns(pod), "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                    "rate", f"{megabits_per_second}mbit", "burst", "256kb", "limit", "16mb"], check=True)


def kill(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
