"""The local gang stops every process it started, including those torchrun puts in sessions of their own.

The "nodes" here are small Python programs shaped like torchrun: a parent that starts
a worker in a new session, and the worker a child of its own (a data-loader worker).
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil

from dtrain_operator.local.launch_plan import NodeLaunch
from dtrain_operator.local.process_gang import Gang

# A launcher like torchrun: the worker goes into a session of its own; the worker starts a child.
LAUNCHER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    if sys.argv[1:] == ["worker"]:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("worker up", flush=True)
        time.sleep(600)
    else:
        if "--ignore-term" in sys.argv:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen([sys.executable, __file__, "worker"], start_new_session=True)
        time.sleep(600)
    """
)


def start_gang(tmp_path: Path, nodes: int, *extra: str) -> Gang:
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    launches = [NodeLaunch(rank, [sys.executable, str(script), *extra], dict(os.environ)) for rank in range(nodes)]
    gang = Gang.start(launches, [tmp_path / f"node-{rank}.log" for rank in range(nodes)], "test")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        gang.remember_descendants()
        if len(gang.seen) >= 3 * nodes:
            return gang
        time.sleep(0.1)
    raise AssertionError(f"the launchers did not start their workers: {gang.seen}")


def alive(pids: list[int]) -> list[int]:
    living = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.append(pid)
        except psutil.NoSuchProcess:
            pass
    return living


def test_stop_ends_every_process_even_when_a_launcher_died_first(tmp_path: Path) -> None:
    gang = start_gang(tmp_path, nodes=2)
    pids = list(gang.seen)
    assert len(alive(pids)) == 6
    # Node 1's launcher dies as a killed torchrun would: its worker lives on, orphaned, in its own session.
    os.kill(gang.nodes[1].popen.pid, signal.SIGKILL)
    time.sleep(0.5)
    assert gang.exited() == {1: -signal.SIGKILL}
    assert len(alive(pids)) == 5
    gang.stop(grace_seconds=2)
    assert alive(pids) == []
    assert gang.exited() == {0: -signal.SIGTERM, 1: -signal.SIGKILL}
    assert "=== test ===" in (tmp_path / "node-0.log").read_text()


def test_a_launcher_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    gang = start_gang(tmp_path, 1, "--ignore-term")
    pids = list(gang.seen)
    started = time.monotonic()
    gang.stop(grace_seconds=1)
    assert alive(pids) == []
    assert gang.exited() == {0: -signal.SIGKILL}
    assert time.monotonic() - started < 10


def test_a_nodes_log_is_read_from_this_gangs_start(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    log.write_text("old run\n" * 5)
    script = tmp_path / "echo.py"
    script.write_text("print('\\n'.join(f'line {i}' for i in range(50)))\n")
    gang = Gang.start([NodeLaunch(0, [sys.executable, str(script)], dict(os.environ))], [log], "gang generation 1")
    gang.nodes[0].popen.wait(timeout=30)
    text = gang.nodes[0].log_since_start()
    assert text.splitlines() == [f"line {i}" for i in range(50)]
