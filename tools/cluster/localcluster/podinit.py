"""A pod's init, as a container runtime would do it: run as PID 1 of the pod's own PID, mount and
UTS namespaces (inside its network namespace), it mounts the pod's volumes where the container
expects them, sets the pod's hostname, then becomes the container's command.

With a root filesystem (`rootfs`: the image's, with a copy-on-write layer of the container's own,
which the kubelet mounted), everything happens inside it, as a runtime does: /proc, /sys, a /dev of
the pod's own, the hosts file, the volumes and the termination-message file are mounted there, the
root is made read-only when `readOnlyRootFilesystem` says so, the process changes root into it,
takes the container's user and groups (runAsUser/runAsGroup, the image's USER, fsGroup and
supplementalGroups), drops the capabilities it is told to and sets no_new_privs, then execs.

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

import ctypes
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


def _private_dev(scratch: str, dev: str = "/dev") -> None:
    """A /dev of the pod's own, as a runtime makes one: a tmpfs with the usual devices bound in from
    the machine's, so that files the pod's mounts need there (/dev/termination-log) never appear
    in the machine's /dev, where any other process could write to them."""
    os.makedirs(scratch, exist_ok=True)
    os.makedirs(dev, exist_ok=True)
    _mount("--rbind", "/dev", scratch)
    _mount("-t", "tmpfs", "-o", "mode=755,nosuid", "tmpfs", dev)
    for name in DEVICES:
        if os.path.exists(os.path.join(scratch, name)):
            open(os.path.join(dev, name), "a").close()
            _mount("--bind", os.path.join(scratch, name), os.path.join(dev, name))
    if os.path.isdir(os.path.join(scratch, "pts")):
        os.mkdir(os.path.join(dev, "pts"))
        _mount("--rbind", os.path.join(scratch, "pts"), os.path.join(dev, "pts"))
    for name, target in DEV_LINKS.items():
        os.symlink(target, os.path.join(dev, name))
    os.mkdir(os.path.join(dev, "shm"))
    _mount("-t", "tmpfs", "-o", "mode=1777,size=64m", "tmpfs", os.path.join(dev, "shm"))
    subprocess.run(["umount", "-l", scratch], check=True)


def _in_root(root: str, path: str) -> str:
    """`path` inside `root`, its symbolic links followed within the root (an image's /var/run -> /run
    must not lead to the machine's /run), as runc's securejoin does."""
    parts, resolved, links = [p for p in path.split("/") if p], root, 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            resolved = os.path.dirname(resolved) if resolved != root else root
            continue
        candidate = os.path.join(resolved, part)
        if os.path.islink(candidate):
            links += 1
            if links > 40:
                raise OSError(f"too many symbolic links in {path}")
            target = os.readlink(candidate)
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                resolved = root
            continue
        resolved = candidate
    return resolved


PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
LAST_CAPABILITY = 40


def _enter_root(root: str, read_only: bool) -> None:
    """The container's own root: the system mounts in it, made read-only if asked, then chroot."""
    for name in ("proc", "sys", "etc"):
        os.makedirs(_in_root(root, name), exist_ok=True)
    _mount("-t", "proc", "proc", _in_root(root, "proc"))
    _mount("--rbind", "/sys", _in_root(root, "sys"))
    _mount("-o", "remount,bind,ro", _in_root(root, "sys"))
    # `ip netns exec` bound the pod's hosts and resolv.conf over /etc: the same files, by inode.
    for name in ("hosts", "resolv.conf"):
        target = os.path.join(_in_root(root, "etc"), name)
        if os.path.islink(target):
            os.unlink(target)
        if not os.path.exists(target):
            open(target, "a").close()
        _mount("--bind", f"/etc/{name}", target)
    if read_only:
        _mount("-o", "remount,bind,ro", root)
    os.chroot(root)
    os.chdir("/")


def _become(user: dict, drop_all_capabilities: bool, no_new_privileges: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if drop_all_capabilities:
        for capability in range(LAST_CAPABILITY + 1):
            libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)
    if no_new_privileges:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.setgroups(user.get("groups") or [])
    os.setgid(user["gid"])
    # From root to another uid, the kernel clears the permitted and effective capabilities.
    os.setuid(user["uid"])


def main(spec_path: str) -> None:
    with open(spec_path) as handle:
        spec = json.load(handle)
    root = spec.get("rootfs")
    # Mount points inside an image's root are the container's own (its copy-on-write layer): no ledger.
    ledger = None if root else spec["ledger"]
    inside = (lambda path: _in_root(root, path)) if root else (lambda path: path)
    _private_dev(spec["devScratch"], inside("/dev"))
    for mount in spec["mounts"]:
        target, kind = inside(mount["target"]), mount["type"]
        _mountpoint(target, kind == "file", None if mount["target"].startswith("/dev/") else ledger)
        if kind == "tmpfs":
            _mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", target)
            continue
        _mount("--bind", mount["source"], target)
        if mount.get("readOnly"):
            _mount("-o", "remount,bind,ro", target)
    socket.sethostname(spec["hostname"])
    # As runc does: a working directory the image lacks (a WORKDIR no layer filled) is made, before a
    # read-only root is remounted so.
    os.makedirs(inside(spec["workingDir"]), exist_ok=True)
    if root:
        _enter_root(root, spec.get("readOnlyRootFilesystem", False))
    if spec.get("user"):
        _become(spec["user"], spec.get("dropAllCapabilities", False), spec.get("noNewPrivileges", False))
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
