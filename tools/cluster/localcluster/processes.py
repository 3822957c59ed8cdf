"""The cluster's processes: started in the background (their own session, output to a log file),
recorded in a pid file, found again by `status`, stopped by `down`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from . import layout


def pid_file(name: str) -> Path:
    return layout.RUN / f"{name}.pid"


def log_file(name: str) -> Path:
    return layout.LOGS / f"{name}.log"


def start(name: str, argv: list[str], env: dict[str, str] | None = None, cwd: Path = layout.REPO) -> int:
    layout.RUN.mkdir(parents=True, exist_ok=True)
    layout.LOGS.mkdir(parents=True, exist_ok=True)
    with log_file(name).open("ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, env=env, cwd=cwd)
    pid_file(name).write_text(str(process.pid))
    return process.pid


def running(name: str) -> int | None:
    """The pid of the named process when it is alive (and not a zombie), else None."""
    try:
        pid = int(pid_file(name).read_text())
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state == "Z" else pid


def names() -> list[str]:
    return sorted(p.stem for p in layout.RUN.glob("*.pid")) if layout.RUN.is_dir() else []


def stop(name: str, grace: float = 10.0) -> None:
    pid = running(name)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while running(name) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    pid_file(name).unlink(missing_ok=True)


def stopped(name: str) -> bool:
    return running(name) is None


def pause(name: str) -> None:
    """SIGSTOP (a server that stops answering), for the scenarios that stop the API server or etcd."""
    pid = running(name)
    if pid is not None:
        os.killpg(pid, signal.SIGSTOP)


def resume(name: str) -> None:
    pid = running(name)
    if pid is not None:
        os.killpg(pid, signal.SIGCONT)


def tail(name: str, lines: int = 20) -> str:
    path = log_file(name)
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait_until(check, what: str, timeout: float, process: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if process is not None and running(process) is None:
            raise RuntimeError(f"{process} exited while waiting for {what}; its log ({log_file(process)}):\n"
                               f"{tail(process)}")
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
