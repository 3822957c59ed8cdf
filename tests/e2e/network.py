"""The node's network: one network namespace per pod, each with a veth on one bridge, and a
per-namespace /etc/hosts that resolves the headless Services' names.

Everything lives in network namespaces this harness creates (`dtrain-e2e-*`): the bridge is in
the "node" namespace, where the API server, the operator and the kubelet run; nothing is added to
the machine's own network namespace, and `teardown` deletes every namespace it made.

    node netns  dtrain-e2e-node:  br0 10.250.0.1/24 (the API server listens here), lo
    pod netns   dtrain-e2e-p<N>:  eth0 10.250.0.<N>/24 (veth peer v<N> on br0), lo

No namespace has a default route: the /24 on the bridge is all there is, so no packet leaves
the node namespace for any other address.

`ip netns exec` binds /etc/netns/<netns>/hosts over /etc/hosts for the pod's processes; the
kubelet rewrites that file in place (same inode) whenever a pod gets or loses an address, as
cluster DNS would answer the new address.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

PREFIX = "dtrain-e2e-"
NODE_NETNS = f"{PREFIX}node"
BRIDGE = "br0"
SUBNET = "10.250.0"
NODE_ADDRESS = f"{SUBNET}.1"
POD_INTERFACE = "eth0"
NETNS_ETC = Path("/etc/netns")
CLUSTER_DOMAIN = "cluster.local"
# No DNS server is reachable from these namespaces (nothing routes out of them): a lookup of a name
# that /etc/hosts lacks fails at once on the loopback instead of waiting for a server's timeout.
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


class NetworkError(RuntimeError):
    pass


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def current_netns() -> str | None:
    """The name of the network namespace this process is in, or None (the machine's own)."""
    own = os.stat("/proc/self/ns/net")
    for path in Path("/run/netns").glob("*") if Path("/run/netns").is_dir() else []:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino):
            return path.name
    return None


def probe() -> None:
    """Fail with what is missing when network namespaces, veth pairs or bridges do not work here."""
    if os.geteuid() != 0:
        raise NetworkError("the e2e needs root (network namespaces, bind mounts): run it as root, as CI does")
    for tool in ("ip", "tc", "unshare", "mount"):
        if shutil.which(tool) is None:
            raise NetworkError(f"`{tool}` is not installed (apt-get install iproute2 util-linux mount)")
    name = f"{PREFIX}probe"
    ip("netns", "del", name, check=False)
    try:
        ip("netns", "add", name)
        ip("-n", name, "link", "add", "probe-br", "type", "bridge")
        ip("-n", name, "link", "add", "probe-a", "type", "veth", "peer", "name", "probe-b")
        ip("-n", name, "link", "set", "probe-a", "master", "probe-br")
    except NetworkError as exc:
        raise NetworkError(f"network namespaces with veth pairs and a bridge do not work on this machine: {exc}") from exc
    finally:
        ip("netns", "del", name, check=False)
    result = subprocess.run(
        ["unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "--propagation", "private",
         "mount", "-t", "tmpfs", "tmpfs", "/mnt"],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise NetworkError(f"PID, mount and UTS namespaces (unshare) do not work on this machine: {result.stderr.strip()}")


def setup_node() -> None:
    """The node namespace and its bridge (idempotent: leftovers of a killed run are removed first)."""
    cleanup_leftovers()
    ip("netns", "add", NODE_NETNS)
    (NETNS_ETC / NODE_NETNS).mkdir(parents=True, exist_ok=True)
    (NETNS_ETC / NODE_NETNS / "resolv.conf").write_text(RESOLV_CONF)
    ip("-n", NODE_NETNS, "link", "set", "lo", "up")
    ip("-n", NODE_NETNS, "link", "add", BRIDGE, "type", "bridge")
    ip("-n", NODE_NETNS, "addr", "add", f"{NODE_ADDRESS}/24", "dev", BRIDGE)
    ip("-n", NODE_NETNS, "link", "set", BRIDGE, "up")


def cleanup_leftovers() -> None:
    for netns in list_netns():
        ip("netns", "del", netns, check=False)
        shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)


def list_netns() -> list[str]:
    result = ip("netns", "list", check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.startswith(PREFIX)]


def bridge_ports() -> list[str]:
    """The interfaces attached to the bridge (what a deleted job must not leave behind)."""
    result = ip("-n", NODE_NETNS, "-o", "link", "show", "master", BRIDGE, check=False)
    return [line.split(":")[1].strip().split("@")[0] for line in result.stdout.splitlines() if line.strip()]


class PodNetwork:
    """One pod's network namespace, veth and address."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.netns = f"{PREFIX}p{index}"
        self.address = f"{SUBNET}.{index}"
        self.host_veth = f"v{index}"
        self.hosts_file = NETNS_ETC / self.netns / "hosts"

    def create(self, hosts: str) -> None:
        ip("netns", "add", self.netns)
        self.hosts_file.parent.mkdir(parents=True, exist_ok=True)
        self.hosts_file.write_text(hosts)
        (self.hosts_file.parent / "resolv.conf").write_text(RESOLV_CONF)
        ip("-n", NODE_NETNS, "link", "add", self.host_veth, "type", "veth", "peer", "name", POD_INTERFACE,
           "netns", self.netns)
        ip("-n", NODE_NETNS, "link", "set", self.host_veth, "master", BRIDGE)
        ip("-n", NODE_NETNS, "link", "set", self.host_veth, "up")
        ip("-n", self.netns, "link", "set", "lo", "up")
        ip("-n", self.netns, "addr", "add", f"{self.address}/24", "dev", POD_INTERFACE)
        ip("-n", self.netns, "link", "set", POD_INTERFACE, "up")

    def write_hosts(self, hosts: str) -> None:
        """Rewrite in place: the file is bind-mounted into the pod's processes by its inode."""
        try:
            with open(self.hosts_file, "r+") as handle:
                handle.seek(0)
                handle.write(hosts)
                handle.truncate()
        except FileNotFoundError:
            pass

    def link(self, up: bool) -> None:
        """The pod's link up or down (a cut cable, a dead switch port)."""
        ip("-n", self.netns, "link", "set", POD_INTERFACE, "up" if up else "down")

    def throttle(self, megabits_per_second: int) -> None:
        """The pod sends at most this fast (a NIC that came up at a lower speed): a token bucket (`tc tbf`)
        on its eth0, with a queue long enough that the link is slow but loses nothing. (tbf, not netem's
        delay: kernels built without sch_netem, as some VMs' are, still have tbf.)"""
        result = subprocess.run(
            ["ip", "netns", "exec", self.netns, "tc", "qdisc", "replace", "dev", POD_INTERFACE, "root", "tbf",
             "rate", f"{megabits_per_second}mbit", "burst", "256kb", "limit", "16mb"],
            capture_output=True, text=True, timeout=30, check=False)
        if result.returncode != 0:
            raise NetworkError(f"tc tbf on {self.netns}'s {POD_INTERFACE}: {result.stderr.strip()} "
                               "(tc is in iproute2; tbf needs the kernel's sch_tbf)")

    def delete(self) -> None:
        ip("netns", "del", self.netns, check=False)  # the veth pair goes with it
        ip("-n", NODE_NETNS, "link", "del", self.host_veth, check=False)
        shutil.rmtree(self.hosts_file.parent, ignore_errors=True)


def hosts_file(own: tuple[str, str], entries: Iterable[tuple[str, list[str]]]) -> str:
    """An /etc/hosts: localhost, the pod's own hostname, and every address with its names."""
    hostname, address = own
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    seen = set()
    for entry_address, names in entries:
        line = f"{entry_address}\t{' '.join(names)}"
        if line not in seen:
            seen.add(line)
            lines.append(line)
    if not any(hostname in names for _, names in entries):
        lines.append(f"{address}\t{hostname}")
    return "\n".join(lines) + "\n"


def pod_names(pod: dict) -> list[str]:
    """The names a pod's address answers to: `<hostname>.<subdomain>.<ns>.svc[.cluster.local]` and short forms."""
    meta, spec = pod["metadata"], pod["spec"]
    hostname = spec.get("hostname") or meta["name"]
    subdomain = spec.get("subdomain")
    if not subdomain:
        return [hostname]
    namespace = meta["namespace"]
    fqdn = f"{hostname}.{subdomain}.{namespace}.svc"
    return [f"{fqdn}.{CLUSTER_DOMAIN}", fqdn, f"{hostname}.{subdomain}.{namespace}", f"{hostname}.{subdomain}", hostname]
