"""`python -m dtrain_trainer.supervisor <launcher arguments>`: a worker pod's first process, around torchrun.

It runs dtrain's launcher (dtrain_trainer.launch: torchrun on the trainer) and tells the operator how it
goes (api.launches), over the same HTTPS endpoint and token as rank 0's records. torchrun exiting 0 ends
the pod as before. torchrun exiting otherwise does not: the supervisor reports the exit (its code, an
OOM kill its cgroup counted, the termination message or the end of the output) and does what the
operator answers. For a restart in place (runPolicy.restartStrategy InPlace) that is: stop torchrun if it
still runs (SIGTERM, which torchrun passes to its workers, then SIGKILL to every process it left after
the grace period), wait until every pod's supervisor has done so, then run torchrun again, which resumes
from the last checkpoint. An order to exit ends the pod with torchrun's own exit code, so that a failure
the operator answers by recreating the pods, or by failing the job, reads as it always did.

SIGTERM (the pod deleted, drained, preempted) goes to torchrun, and the supervisor exits with its code.
An operator that does not answer for ORPHAN_SECONDS after a failed torchrun is not waited on longer:
the supervisor exits with the failure, and the pod is replaced as without it. Without the operator's
address (reports off) the supervisor is the launcher itself.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from dtrain_operator.api import contract
from dtrain_operator.api.launches import (
    ACTION_EXIT,
    ACTION_RUN,
    ACTION_STOP,
    MAX_MESSAGE_CHARS,
    POLL_SECONDS,
    REASON_STOPPED,
    STATE_EXITED,
    STATE_RUNNING,
    LaunchOrder,
    LaunchReport,
)
from dtrain_trainer.operator_link import Answer, OperatorLink

LAUNCHER_MODULE = "dtrain_trainer.launch"
# A failed torchrun waits this long for the operator's word before the pod fails as it would without one.
ORPHAN_SECONDS = 60.0
# The operator holds a request up to POLL_SECONDS; an answer may take that plus a busy operator's time.
POLL_TIMEOUT_SECONDS = POLL_SECONDS + 10.0
RETRY_SECONDS = 2.0
TAIL_LINES = 80
OOM_EVENTS = Path("/sys/fs/cgroup/memory.events")
PR_SET_CHILD_SUBREAPER = 36


def say(message: str) -> None:
    print(f"dtrain supervisor: {message}", file=sys.stderr, flush=True)


def exit_code(returncode: int) -> int:
    """A process's exit as a container reports it: 128 + n when signal n killed it."""
    return contract.SIGNAL_EXIT_BASE - returncode if returncode < 0 else returncode


def oom_kills(events: Path = OOM_EVENTS) -> int | None:
    """The cgroup's count of OOM kills (cgroup v2), None where it cannot be read."""
    try:
        for line in events.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def descendants(root: int) -> list[int]:
    """Every process below `root` (from /proc): torchrun starts each worker in a session of its own."""
    parents: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(fields[1])].append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def reap() -> None:
    """Collect the exit of every child that has ended (orphaned workers re-parented to the supervisor). Only once
    torchrun's own exit is collected: its Popen must read its status first."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Launch:
    """One torchrun: its process, its output passed through (the end of it kept), its OOM count at start."""

    def __init__(self, argv: Sequence[str], generation: int, termination_log: Path) -> None:
        self.generation = generation
        self.termination_log = termination_log
        try:
            termination_log.write_text("")  # an earlier launch's message is not this one's
        except OSError:
            pass
        self.oom_at_start = oom_kills()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.process = subprocess.Popen(
            [sys.executable, "-m", LAUNCHER_MODULE, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self._copier = threading.Thread(target=self._copy, name="dtrain-supervisor-output", daemon=True)
        self._copier.start()

    def _copy(self) -> None:
        assert self.process.stdout is not None
        out = sys.stdout.buffer
        for line in iter(self.process.stdout.readline, b""):
            out.write(line)
            out.flush()
            self.tail.append(line.decode(errors="replace"))

    def poll(self) -> int | None:
        code = self.process.poll()
        return None if code is None else exit_code(code)

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, grace_seconds: float) -> int:
        """SIGTERM to torchrun, which passes it on; SIGKILL to whatever is left after the grace period."""
        self.terminate()
        try:
            self.process.wait(grace_seconds)
        except subprocess.TimeoutExpired:
            say(f"torchrun did not stop within {grace_seconds:g} s of SIGTERM; killing it and its workers")
            self.kill_all_left()
        return self.wait()

    def wait(self) -> int:
        code = exit_code(self.process.wait())
        self.kill_all_left()
        reap()
        self._copier.join(5.0)
        return code

    def kill_all_left(self) -> None:
        """Every process below the supervisor: torchrun, if it still runs, and the workers it started or left behind
        (re-parented to the supervisor, their subreaper)."""
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def exit_report(self, code: int) -> tuple[str, str]:
        """The reason and message of its exit, as a pod's would be."""
        oom, before = oom_kills(), self.oom_at_start
        killed = code == contract.SIGNAL_EXIT_BASE + signal.SIGKILL
        reason = "OOMKilled" if killed and oom is not None and before is not None and oom > before else "Error"
        try:
            message = self.termination_log.read_text(errors="replace").strip()
        except OSError:
            message = ""
        if not message:
            message = "".join(self.tail).strip()
        return reason, message[-MAX_MESSAGE_CHARS:]


# What an order comes to, given the launch the supervisor has (`step`).
STEP_NOTHING, STEP_REPLACE, STEP_STOP, STEP_EXIT = "nothing", "replace", "stop", "exit"


def step(launch_generation: int | None, order: LaunchOrder) -> str:
    """The one place an order meets the launch: what to do now.

    `run` for the generation of the latest launch is never a new launch of it, whether that launch runs or has
    ended: a launch that ended by itself (0: this rank finished; otherwise a failure) is the loop's to report
    (`launch_ended`), even when it ended between the loop's look at it and this order (the operator answers a
    supervisor that reports its launch running with `run` for it). A generation is started once per pod; an
    in-place restart is always a newer generation."""
    if order.action == ACTION_RUN:
        return STEP_NOTHING if launch_generation == order.generation else STEP_REPLACE
    if order.action == ACTION_STOP:
        return STEP_STOP
    if order.action == ACTION_EXIT:
        return STEP_EXIT
    return STEP_NOTHING


def acted_on(launch_generation: int | None, order: LaunchOrder) -> bool:
    """Whether the main thread acts on `order`, after which the report says what came of it. An order already in
    effect (wait; run for the generation that runs) is not: the next question goes at once, and the operator holds
    it until it has something new to say, so that a stop reaches a running rank as soon as it is decided."""
    return step(launch_generation, order) != STEP_NOTHING


class Supervisor:
    """The loop: torchrun's exits and the operator's orders, one at a time, on the main thread."""

    def __init__(
        self, argv: Sequence[str], link: OperatorLink, path: str, generation: int, termination_log: Path
    ) -> None:
        self.argv = list(argv)
        self.link = link
        self.path = path
        self.termination_log = termination_log
        self.lock = threading.Lock()
        self.report_changed = threading.Condition(self.lock)
        self.last_complaint = 0.0
        self.report = LaunchReport(generation=generation, state=STATE_RUNNING)
        self.orders: queue.Queue[tuple[int, LaunchOrder]] = queue.Queue()
        self.answered = time.monotonic()
        self.terminated = threading.Event()
        self.launch: Launch | None = None
        self.last_code = 0

    def set_report(self, **fields: object) -> LaunchReport:
        with self.lock:
            self.report = self.report.model_copy(update={**fields, "sequence": self.report.sequence + 1})
            self.report_changed.notify_all()
            return self.report

    def ask(self, report: LaunchReport) -> LaunchOrder | None:
        """Send `report`; queue the operator's order, tagged with the report it answers."""
        body = json.dumps(report.model_dump(by_alias=True, exclude_none=True)).encode()
        answer = self.link.post(self.path, body, POLL_TIMEOUT_SECONDS)
        if isinstance(answer, Answer):
            self.answered = time.monotonic()
            try:
                order = LaunchOrder.model_validate_json(answer.body)
            except ValueError as exc:
                self.complain(f"the operator's answer is not an order ({exc})")
                return None
            self.orders.put((report.sequence, order))
            return order
        self.complain(f"the operator did not answer ({answer})")
        self.terminated.wait(RETRY_SECONDS)
        return None

    def complain(self, problem: str) -> None:
        """Once a minute at most: an operator failing over answers nothing for a while."""
        if time.monotonic() - self.last_complaint >= 60.0:
            self.last_complaint = time.monotonic()
            say(f"{problem}; asking again")

    def poll_forever(self) -> None:
        while not self.terminated.is_set():
            with self.lock:
                report = self.report
            order = self.ask(report)
            launch = self.launch
            if order is not None and acted_on(launch.generation if launch is not None else None, order):
                # The main thread acts on it (a stop takes up to its grace period): ask again once the report
                # says what came of it, not with the same report meanwhile.
                asked = report.sequence
                with self.lock:
                    self.report_changed.wait_for(lambda asked=asked: self.report.sequence != asked, RETRY_SECONDS * 5)

    def start(self, generation: int) -> None:
        say(f"starting torchrun for gang generation {generation}")
        self.launch = Launch(self.argv, generation, self.termination_log)
        self.set_report(generation=generation, state=STATE_RUNNING, exit_code=None, reason=None, message=None)

    def stop(self, grace_seconds: float, why: str) -> None:
        if self.launch is None or self.launch.poll() is not None:
            return
        say(f"stopping torchrun ({why})")
        self.last_code = self.launch.stop(grace_seconds)
        self.set_report(state=STATE_EXITED, exit_code=self.last_code, reason=REASON_STOPPED, message=None)

    def run(self) -> int:
        self.start(self.report.generation)
        threading.Thread(target=self.poll_forever, name="dtrain-supervisor-poll", daemon=True).start()
        while True:
            if self.terminated.is_set():
                return self.on_sigterm()
            ended = self.launch_ended()
            if ended is not None:
                return ended
            try:
                sequence, order = self.orders.get(timeout=0.5)
            except queue.Empty:
                continue
            with self.lock:
                current = self.report.sequence
            if sequence != current:
                continue  # it answers a report older than the one in effect
            done = self.obey(order)
            if done is not None:
                return done

    def launch_ended(self) -> int | None:
        """A torchrun that ended by itself: 0 ends the pod; a failure is reported at once and waits for orders,
        or ends the pod when the operator has not answered for ORPHAN_SECONDS."""
        launch = self.launch
        if launch is None:
            return None
        code = launch.poll()
        if code is None:
            return None
        if self.report.state == STATE_RUNNING:
            code = launch.wait()
            self.last_code = code
            if code == 0:
                return 0
            reason, message = launch.exit_report(code)
            say(f"torchrun exited with code {code} ({reason}); asking the operator what to do")
            report = self.set_report(state=STATE_EXITED, exit_code=code, reason=reason, message=message)
            self.answered = time.monotonic()
            threading.Thread(target=self.ask, args=(report,), daemon=True).start()
        if self.report.reason != REASON_STOPPED and time.monotonic() - self.answered > ORPHAN_SECONDS:
            say(f"the operator has not answered for {ORPHAN_SECONDS:g} s; exiting with torchrun's code {self.last_code}")
            return self.last_code
        return None

    def obey(self, order: LaunchOrder) -> int | None:
        """Carry out one order (`step` decides what it comes to); an exit code ends the supervisor."""
        action = step(self.launch.generation if self.launch is not None else None, order)
        if action == STEP_REPLACE:
            self.stop(order.grace_seconds, f"gang generation {order.generation} replaces it")
            self.start(order.generation)
        elif action == STEP_STOP:
            self.stop(order.grace_seconds, order.why or "the operator's order")
        elif action == STEP_EXIT:
            # torchrun may have ended by itself since the loop looked, unreported yet: its own code, 0 included.
            unreported = self.launch.poll() if self.launch is not None and self.report.state == STATE_RUNNING else None
            self.stop(order.grace_seconds, order.why or "the operator's order")
            code = unreported if unreported is not None else self.last_code or contract.SIGNAL_EXIT_BASE + signal.SIGTERM
            say(f"exiting with torchrun's code {code} ({order.why})")
            return code
        return None

    def on_sigterm(self) -> int:
        """The pod is going away: torchrun gets SIGTERM and its whole grace (the kubelet's clock), then its code."""
        if self.launch is None or self.launch.poll() is not None:
            return self.last_code or contract.SIGNAL_EXIT_BASE + signal.SIGTERM
        self.launch.terminate()
        return self.launch.wait()


def become_subreaper() -> None:
    """Orphaned workers are re-parented to this process (not to init), so that it can find and reap them."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(
    argv: Sequence[str] | None = None,
    token_path: Path = Path(contract.OPERATOR_TOKEN_PATH),
    ca_path: Path = Path(contract.OPERATOR_CA_PATH),
) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ
    url, namespace, name = (env.get(k) for k in (contract.ENV_OPERATOR_URL, contract.ENV_JOB_NAMESPACE, contract.ENV_JOB_NAME))
    if not url or not namespace or not name or not token_path.is_file():
        os.execv(sys.executable, [sys.executable, "-m", LAUNCHER_MODULE, *argv])
    link = OperatorLink(url, token_path=token_path, ca_path=ca_path)
    termination_log = Path(env.get(contract.ENV_TERMINATION_LOG) or contract.TERMINATION_LOG_PATH)
    supervisor = Supervisor(
        argv, link, contract.launch_path(namespace, name), int(env.get(contract.ENV_GANG_GENERATION) or 0), termination_log
    )
    signal.signal(signal.SIGTERM, lambda *_: supervisor.terminated.set())
    become_subreaper()
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
