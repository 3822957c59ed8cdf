"""The local gang: one torchrun process group per node, watched and stopped together.

torchrun starts each worker in a session of its own, so signalling torchrun's
process group does not reach a worker whose torchrun has died. The gang therefore
remembers every descendant it has seen and, when it stops, signals all of them.
The runner also makes itself the "child subreaper" (Linux), so a worker orphaned by
its torchrun is re-parented here rather than to init and can be found and reaped.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from dtrain_operator.local.launch_plan import NodeLaunch

_PR_SET_CHILD_SUBREAPER = 36


def become_child_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process (Linux only); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@dataclass
class NodeProcess:
    """A running node: its torchrun, its log, and where this gang's part of the log starts."""

    launch: NodeLaunch
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int

    @property
    def rank(self) -> int:
        return self.launch.rank

    def log_since_start(self) -> str:
        """What this gang's run of the node wrote to its log."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_offset)
                text = log.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return text


@dataclass
class Gang:
    """The nodes of one gang generation."""

    nodes: list[NodeProcess]
    # Every descendant seen, by pid, with its start time (so a reused pid is never signalled).
    seen: dict[int, float] = field(default_factory=dict)
    # This process is a child subreaper that starts nothing else meanwhile: its own children
    # include every orphan of the gang, even one whose launcher died before it was seen.
    adopts_orphans: bool = False

    @classmethod
    def start(
        cls, launches: Sequence[NodeLaunch], log_paths: Sequence[Path], header: str, adopts_orphans: bool = False
    ) -> Gang:
        nodes: list[NodeProcess] = []
        for launch, log_path in zip(launches, log_paths):
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as log:
                log.write(f"=== {header} ===\n".encode())
                log.flush()
                offset = log.tell()
                # A session of its own: the terminal's Ctrl-C reaches the runner only, which stops the gang in order.
                popen = subprocess.Popen(
                    launch.argv,
                    env=launch.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            nodes.append(NodeProcess(launch, popen, log_path, offset))
        gang = cls(nodes, adopts_orphans=adopts_orphans)
        gang.remember_descendants()
        return gang

    @property
    def pids(self) -> list[int]:
        return [node.popen.pid for node in self.nodes]

    def remember_descendants(self) -> None:
        roots = [node.popen.pid for node in self.nodes]
        if self.adopts_orphans:
            roots.append(os.getpid())
        for root in roots:
            for proc in _tree(root):
                if proc.pid != os.getpid():
                    self._remember(proc)

    def _remember(self, proc: psutil.Process) -> None:
        try:
            self.seen.setdefault(proc.pid, proc.create_time())
        except psutil.Error:
            pass

    def exited(self) -> dict[int, int]:
        """Return codes of the nodes whose torchrun has exited, by rank."""
        return {node.rank: code for node in self.nodes if (code := node.popen.poll()) is not None}

    def running(self) -> bool:
        return any(node.popen.poll() is None for node in self.nodes)

    def stop(self, grace_seconds: float) -> None:
        """SIGTERM the whole gang, then SIGKILL whatever is left after `grace_seconds`.

        torchrun passes SIGTERM on to its workers, but a worker whose torchrun has died
        has no one to do so: every remembered descendant is signalled directly.
        """
        self.remember_descendants()
        for node in self.nodes:
            if node.popen.poll() is None:
                _signal_group(node.popen.pid, signal.SIGTERM)
        for proc in self._alive():
            try:
                proc.terminate()
            except psutil.Error:
                pass
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and (self.running() or self._alive()):
            self.remember_descendants()
            time.sleep(0.1)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the whole gang, orphans included, and reap it."""
        for _ in range(5):
            self.remember_descendants()
            alive = self._alive()
            for node in self.nodes:
                if node.popen.poll() is None:
                    _signal_group(node.popen.pid, signal.SIGKILL)
            if not alive and not self.running():
                break
            for proc in alive:
                # Descendants spawned since the last look are found through the live ones.
                for child in _tree(proc.pid):
                    self._remember(child)
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(alive, timeout=2)
        for node in self.nodes:
            try:
                node.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _alive(self) -> list[psutil.Process]:
        """Remembered descendants still running (zombies of our own are reaped on the way)."""
        alive = []
        for pid, created in self.seen.items():
            if pid in self.pids:
                continue
            try:
                proc = psutil.Process(pid)
                if proc.create_time() != created:
                    continue
                if proc.status() == psutil.STATUS_ZOMBIE:
                    _reap(pid)
                    continue
                alive.append(proc)
            except psutil.Error:
                continue
        return alive


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(pid: int) -> None:
    """Collect an adopted orphan's exit status, so that it does not stay a zombie of the runner."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
