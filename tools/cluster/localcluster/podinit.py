"""A pod's init, as a container runtime would do it: run as PID 1 of the pod's own PID, mount and
UTS namespaces (inside its network namespace), it mounts the pod's volumes where the container
expects them, sets the pod's hostname, then becomes the container's command.

    ip netns exec <netns> unshare --mount --uts --pid --fork --kill-child --mount-proc \
        --propagation private python podinit.py <spec.json>

The mounts are bind mounts (and tmpfs for `emptyDir: {medium: Memory}`) in the pod's private
mount namespace: the container sees /etc/dtrain/config.yaml, /workspace, /dev/termination-log and
its service-account token at the paths it was rendered with, and nobody else sees them. A mount
point that does not exist on the machine is created (an empty directory) and named in the ledger
file, so that the kubelet can remove it at the end; /dev is the pod's own tmpfs (the machine's
devices bound in), so /dev/termination-log never exists outside the pod.

Standard library only, and no import from the repository: this runs before the container's
environment is the pod's.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys


def _record(ledger: str | None, path: str) -> None:
    if ledger is None:
        return  # inside the pod's own /dev: nothing to remove on the machine
    with open(ledger, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(path + "\n")


def _mountpoint(target: str, is_file: bool, ledger: str | None) -> None:
    if os.path.lexists(target):
        return
    parent = os.path.dirname(target)
    missing = []
    while parent and not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for path in reversed(missing):
        os.mkdir(path)
        _record(ledger, path)
    if is_file:
        open(target, "a").close()
    else:
        os.mkdir(target)
    _record(ledger, target)


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"}


def _private_dev(scratch: str) -> None:
    """A /dev of the pod's own, as a runtime makes one: a tmpfs with the usual devices bound in from
    the machine's, so that files the pod's mounts need there (/dev/termination-log) never appear
    in the machine's /dev, where any other process could write to them."""
    os.makedirs(scratch, exist_ok=True)
    _mount("--rbind", "/dev", scratch)
    _mount("-t", "tmpfs", "-o", "mode=755,nosuid", "tmpfs", "/dev")
    for name in DEVICES:
        if os.path.exists(os.path.join(scratch, name)):
            open(os.path.join("/dev", name), "a").close()
            _mount("--bind", os.path.join(scratch, name), os.path.join("/dev", name))
    if os.path.isdir(os.path.join(scratch, "pts")):
        os.mkdir("/dev/pts")
        _mount("--rbind", os.path.join(scratch, "pts"), "/dev/pts")
    for name, target in DEV_LINKS.items():
        os.symlink(target, os.path.join("/dev", name))
    os.mkdir("/dev/shm")
    _mount("-t", "tmpfs", "-o", "mode=1777,size=64m", "tmpfs", "/dev/shm")
    subprocess.run(["umount", "-l", scratch], check=True)


def main(spec_path: str) -> None:
    with open(spec_path) as handle:
        spec = json.load(handle)
    ledger = spec["ledger"]
    _private_dev(spec["devScratch"])
    for mount in spec["mounts"]:
        target, kind = mount["target"], mount["type"]
        _mountpoint(target, kind == "file", None if target.startswith("/dev/") else ledger)
        if kind == "tmpfs":
            _mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", target)
            continue
        _mount("--bind", mount["source"], target)
        if mount.get("readOnly"):
            _mount("-o", "remount,bind,ro", target)
    socket.sethostname(spec["hostname"])
    os.chdir(spec["workingDir"])
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as exc:
        # What a runtime reports for a command it cannot start: exit 127 (not found) or 126.
        print(f"podinit: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)


if __name__ == "__main__":
    main(sys.argv[1])
