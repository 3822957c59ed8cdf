"""The pods' network: a bridge in the machine's own network namespace, one network namespace per pod.

    machine     dtrain0 10.250.0.1/16 (the API server listens on it), v<node>x<k> (each pod's veth peer)
    pod netns   dtrain-c-<node>-<k>: eth0 10.250.<node>.<k>/16, lo

No namespace gets a default route: the /16 on the bridge is all there is, so a pod reaches the
API server, the kubelets and other pods, and nothing else. `ip netns exec` binds
/etc/netns/<netns>/hosts over /etc/hosts for the pod's processes; the kubelet writes it from the
EndpointSlices of the pod's namespace (there is no cluster DNS), in place, as DNS would answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from . import layout

POD_INTERFACE = "eth0"
NETNS_ETC = Path("/etc/netns")
# Nothing answers DNS: a lookup of a name the hosts file lacks fails at once instead of timing out.
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


class NetworkError(RuntimeError):
    pass


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def probe() -> None:
    """Fail with what is missing when this machine cannot run the cluster's pods."""
    if os.geteuid() != 0:
        raise NetworkError("the local cluster needs root (network namespaces, bind mounts): run it as root")
    for tool in ("ip", "tc", "unshare", "mount", "openssl", "pkill"):
        if shutil.which(tool) is None:
            raise NetworkError(f"`{tool}` is not installed (tools/install-e2e-deps.sh installs it from Debian's packages)")
    name = f"{layout.NETNS_PREFIX}probe"
    ip("netns", "del", name, check=False)
    try:
        ip("netns", "add", name)
        ip("-n", name, "link", "add", "probe-a", "type", "veth", "peer", "name", "probe-b")
    except NetworkError as exc:
        raise NetworkError(f"network namespaces with veth pairs do not work on this machine: {exc}") from exc
    finally:
        ip("netns", "del", name, check=False)


def setup_bridge() -> None:
    if ip("link", "show", layout.BRIDGE, check=False).returncode == 0:
        return
    ip("link", "add", layout.BRIDGE, "type", "bridge")
    ip("addr", "add", f"{layout.BRIDGE_ADDRESS}/16", "dev", layout.BRIDGE)
    ip("link", "set", layout.BRIDGE, "up")


def teardown() -> None:
    """Every pod namespace and the bridge (their veths go with the namespaces)."""
    for netns in list_netns():
        ip("netns", "del", netns, check=False)
        shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)
    ip("link", "del", layout.BRIDGE, check=False)


def list_netns() -> list[str]:
    result = ip("netns", "list", check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.startswith(layout.NETNS_PREFIX)]


class PodNetwork:
    """One pod's network namespace, veth and address."""

    def __init__(self, node: layout.Node, index: int) -> None:
        self.netns = f"{layout.NETNS_PREFIX}{node.index}-{index}"
        self.address = f"{node.subnet}.{index}"
        self.host_veth = f"v{node.index}x{index}"
        self.hosts_file = NETNS_ETC / self.netns / "hosts"

    def create(self, hosts: str) -> None:
        self.delete()  # a namespace a killed kubelet left under this name
        ip("netns", "add", self.netns)
        self.hosts_file.parent.mkdir(parents=True, exist_ok=True)
        self.hosts_file.write_text(hosts)
        (self.hosts_file.parent / "resolv.conf").write_text(RESOLV_CONF)
        ip("link", "add", self.host_veth, "type", "veth", "peer", "name", POD_INTERFACE, "netns", self.netns)
        ip("link", "set", self.host_veth, "master", layout.BRIDGE)
        ip("link", "set", self.host_veth, "up")
        ip("-n", self.netns, "link", "set", "lo", "up")
        ip("-n", self.netns, "addr", "add", f"{self.address}/16", "dev", POD_INTERFACE)
        ip("-n", self.netns, "link", "set", POD_INTERFACE, "up")

    def write_hosts(self, hosts: str) -> None:
        """Rewrite in place: the file is bind-mounted into the pod's processes by its inode."""
        try:
            with open(self.hosts_file, "r+") as handle:
                if handle.read() == hosts:
                    return
                handle.seek(0)
                handle.write(hosts)
                handle.truncate()
        except FileNotFoundError:
            pass

    def link(self, up: bool) -> None:
        """The pod's link up or down (a cut cable, a dead switch port)."""
        ip("-n", self.netns, "link", "set", POD_INTERFACE, "up" if up else "down")

    def delete(self) -> None:
        ip("netns", "del", self.netns, check=False)  # the veth pair goes with it
        ip("link", "del", self.host_veth, check=False)
        shutil.rmtree(self.hosts_file.parent, ignore_errors=True)


def hosts_file(own: tuple[str, str], entries: Iterable[tuple[str, list[str]]]) -> str:
    """An /etc/hosts: localhost, the pod's own hostname, and every address with its names."""
    hostname, address = own
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    seen = set()
    entries = list(entries)
    for entry_address, names in entries:
        line = f"{entry_address}\t{' '.join(names)}"
        if line not in seen:
            seen.add(line)
            lines.append(line)
    if not any(hostname in names for _, names in entries):
        lines.append(f"{address}\t{hostname}")
    return "\n".join(lines) + "\n"
