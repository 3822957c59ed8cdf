"""Upstream etcd and kube-apiserver for a test session or a benchmark run, as envtest starts them.

They are the control plane `make cluster` runs (tools/cluster/controlplane's binary, started by
tools/cluster/localcluster with the same flags: RBAC, the default admission plugins, the audit log),
but in a throwaway state directory and on free ports of their own, so that several run side by side
(one per pytest worker) and beside a `make cluster`. No scheduler and no kubelet; the controller manager
only where asked for, with the controllers asked for (the garbage collector, for the operator's tests).

localcluster reads its state directory and ports from the environment when it is first imported, so
the two servers are started and stopped by this module run as a child process (`python -m
tests.control_plane start|stop`): the process that asks may have imported localcluster already.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[1]
CLUSTER_TOOLS = REPO / "tools" / "cluster"
COMPONENTS = ("kube-controller-manager", "kube-apiserver", "etcd")  # stopped in this order
CONTROLLERS_VARIABLE = "DTRAIN_TEST_CONTROLLERS"  # the child's: which controllers to run (none when unset)
WITH_CRD_VARIABLE = "DTRAIN_TEST_WITH_CRD"  # the child's: install this checkout's CRD first
STOP_GRACE_SECONDS = 5.0  # nothing of theirs outlives the run: no need for kube-apiserver's slow goodbye
DESCRIPTION = "control-plane.json"  # in the state directory: the ControlPlane the child started


@dataclass(frozen=True)
class ControlPlane:
    url: str
    kubeconfig: str  # the admin's (system:masters)
    ca: str
    admin_cert: str
    admin_key: str
    audit_log: str
    logs: str
    state: str

    def pid(self, component: str) -> int | None:
        """The component's pid while it runs (localcluster's pid file), else None."""
        try:
            pid = int((Path(self.state) / "run" / f"{component}.pid").read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid


class AuditLog:
    """Every request the server logged, once each (a watch has two stages), read as the file grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self._seen: set[str] = set()
        self.requests: list[tuple[str, str]] = []  # (user agent, "verb resource[/subresource]")

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as log:
            log.seek(self._offset)
            data = log.read()
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            event = json.loads(line)
            if event["auditID"] in self._seen:
                continue
            self._seen.add(event["auditID"])
            ref = event.get("objectRef") or {}
            if ref.get("resource"):
                what = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            else:
                what = event.get("requestURI", "")
            self.requests.append((event.get("userAgent", ""), f"{event['verb']} {what}"))

    def requests_of(self, agents: tuple[str, ...]) -> list[str]:
        """The requests so far, in order, of the clients whose user agent starts with one of `agents`."""
        self.read()
        return [kind for agent, kind in self.requests if agent.startswith(agents)]


def binary_dir() -> Path:
    """Where `make cluster` keeps (and controlplane.build() makes) the binary: a throwaway state keeps using it."""
    if os.environ.get("DTRAIN_CLUSTER_BIN"):
        return Path(os.environ["DTRAIN_CLUSTER_BIN"])
    return Path(os.environ.get("DTRAIN_CLUSTER_DIR") or REPO / ".cluster") / "bin"


def _environment(state: Path, controllers: str | None, with_crd: bool) -> dict[str, str]:
    return {
        **os.environ,
        "DTRAIN_CLUSTER_DIR": str(state),
        "DTRAIN_CLUSTER_BIN": str(binary_dir()),
        # No bridge here: kube-apiserver listens on every address, 127.0.0.1 is in its certificate, and the
        # address it advertises (the bridge's) is only what the `kubernetes` Service's endpoints would name.
        "DTRAIN_APISERVER_HOST": "127.0.0.1",
        "DTRAIN_ETCD_CLIENT_PORT": str(free_port()),
        "DTRAIN_ETCD_PEER_PORT": str(free_port()),
        "DTRAIN_APISERVER_PORT": str(free_port()),
        "DTRAIN_CONTROLLER_MANAGER_PORT": str(free_port()),
        **({CONTROLLERS_VARIABLE: controllers} if controllers else {}),
        **({WITH_CRD_VARIABLE: "1"} if with_crd else {}),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(CLUSTER_TOOLS), os.environ.get("PYTHONPATH", "")]),
    }


@contextlib.contextmanager
def started(parent: Path, controllers: str | None = None, with_crd: bool = False) -> Iterator[ControlPlane]:
    """etcd and kube-apiserver (with this checkout's CRD installed when `with_crd`, and then kube-controller-manager
    running `controllers`, a --controllers value) in a new state directory under `parent`, running until the
    block ends (however it ends). The CRD comes first: the garbage collector looks for new kinds of owners only
    every 30 s."""
    state = Path(tempfile.mkdtemp(prefix="controlplane-", dir=parent))
    env = _environment(state, controllers, with_crd)
    try:
        subprocess.run([sys.executable, "-m", "tests.control_plane", "start"], env=env, cwd=REPO, check=True)
        yield ControlPlane(**json.loads((state / DESCRIPTION).read_text()))
    finally:
        subprocess.run([sys.executable, "-m", "tests.control_plane", "stop"], env=env, cwd=REPO, check=False)


def _start() -> None:
    """In the child: build the binary when missing (one build at a time: pytest's workers start together),
    then the certificates, etcd and kube-apiserver; describe them for the parent."""
    from localcluster import controlplane, layout, pki

    binary_dir().mkdir(parents=True, exist_ok=True)
    with (binary_dir() / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        controlplane.build()
    pki.make_all([])
    admin = pki.client("admin", "kubernetes-admin", "system:masters")
    kubeconfig = pki.kubeconfig(layout.STATE / "kubeconfig", "kubernetes-admin", *admin)
    print(f"control plane: etcd and kube-apiserver {layout.KUBERNETES_VERSION} on {layout.APISERVER_URL} "
          f"(state: {layout.STATE})", flush=True)
    controlplane.start_etcd()
    controlplane.start_apiserver()  # with its audit log (controlplane.AUDIT_POLICY)
    plane = ControlPlane(
        url=layout.APISERVER_URL, kubeconfig=str(kubeconfig), ca=str(pki.ca()[0]), admin_cert=str(admin[0]),
        admin_key=str(admin[1]), audit_log=str(layout.AUDIT_LOG), logs=str(layout.LOGS), state=str(layout.STATE),
    )
    if os.environ.get(WITH_CRD_VARIABLE):
        from tests.kube_admission import KubeAdmission

        KubeAdmission(plane)
    if os.environ.get(CONTROLLERS_VARIABLE):
        controlplane.start_controller_manager(os.environ[CONTROLLERS_VARIABLE])
    (layout.STATE / DESCRIPTION).write_text(json.dumps(asdict(plane)))


def _stop() -> None:
    from localcluster import processes

    for component in COMPONENTS:
        processes.stop(component, grace=STOP_GRACE_SECONDS)


if __name__ == "__main__":
    {"start": _start, "stop": _stop}[sys.argv[1]]()
