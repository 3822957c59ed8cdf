"""Where a hang sits: every rank's Python stacks, collected by rank 0 before the progress deadline restarts the gang.

A gang that stops completing batches is restarted by the operator (and `dtrain run`) once
runPolicy.progressDeadlineSeconds runs out (core.progress_deadline). A little before that, rank 0's watch
sees the stall by itself (no training or validation batch for `collect_after_seconds`, a checkpoint write
holding the clock as it holds the deadline's) and asks every rank for its stacks through torchrun's store:
a TCP connection of each watch's own to the agent's store, not a collective, so it works while every rank
is blocked in one, and needs no `pods/exec`.

- Every rank runs a watch thread, blocked on the store until rank 0 asks (`request/<n>`). It then takes
  the stacks of all its Python threads (`sys._current_frames`: each frame's module, function, file and
  line, never a local or a line of source), answers (`answer/<n>/<rank>`), and, where PyTorch's flight
  recorder is on (TORCH_FR_BUFFER_SIZE, which the operator sets for GPU jobs), writes its dump of the
  last collectives into the hang's directory itself.
- Rank 0 waits up to ANSWER_SECONDS for the answers; a rank that gives none is silent: stopped
  (SIGSTOP), cut off from rank 0's node, or stuck in native code that holds the interpreter lock.
- Rank 0 sends a bounded summary through its progress sink (records.HangRecord: the ranks grouped by the
  frames of their training thread, the innermost of those, the innermost of the user's or dtrain's code,
  the silent ranks), then writes every rank's full stacks to <artifacts.dir>/hangs/<time>-step-<step>/
  stacks.txt and the summary to hang.json beside it.

The operator and `dtrain run` compare the groups when the deadline runs out (core.hang_diagnosis). The
watch costs training nothing (rank 0's reads two counters every POLL_SECONDS, the others wait on a
socket); a failure of its own is logged and ends it, never the training.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from dtrain_common import object_store
from dtrain_operator.api import TrainerConfig, contract
from dtrain_operator.api.records import Event
from dtrain_operator.api.stacks import MAX_CODE_FRAMES, MAX_FRAMES, MAX_GROUPS, format_ranks, is_framework
from dtrain_operator.api.storage import is_object_url
from dtrain_trainer.progress import ProgressReporter, utc_now

log = logging.getLogger("dtrain_trainer")

STORE_PREFIX = "dtrain/hang"
POLL_SECONDS = 0.5
# How long rank 0 waits for the other ranks' answers: a snapshot takes milliseconds on a rank whose threads run.
ANSWER_SECONDS = 3.0
# Rank 0 collects this long before the deadline could run out: its answers and the record's trip to the operator.
COLLECT_MARGIN_SECONDS = ANSWER_SECONDS + 2.0
# A rank's watch waits on the store in waits this long (a training longer than that just waits again).
SERVE_WAIT = timedelta(days=1)
END = "end"

# (batches completed by rank 0, whether the clock holds (a checkpoint being written), the global step)
Probe = Callable[[], tuple[int, bool, int | None]]


def collect_after_seconds(deadline_seconds: int, report_interval_seconds: float) -> float | None:
    """How long rank 0 goes without a completed batch before it collects the stacks (None: never).

    The operator's deadline runs from the last progress record it received, which can be up to one report
    interval older than rank 0's last batch: collecting by `deadline - interval - margin` after that batch
    lands the record first. Never sooner than a third of the deadline: a slow step is not a hang."""
    if deadline_seconds <= 0:
        return None
    return max(deadline_seconds / 3, deadline_seconds - report_interval_seconds - COLLECT_MARGIN_SECONDS)


def thread_stacks(skip: int | None = None) -> list[dict[str, Any]]:
    """The stack of every Python thread of this process but `skip`, innermost frame first; the training
    (main) thread first. Frames carry module, function, file and line: never locals or source text."""
    main = threading.main_thread().ident
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    stacks = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        frames = []
        current: Any = frame
        while current is not None:
            code = current.f_code
            module = current.f_globals.get("__name__")
            function = getattr(code, "co_qualname", code.co_name)
            frames.append([str(module), function, code.co_filename, current.f_lineno])
            current = current.f_back
        stacks.append({"name": names.get(ident, f"thread {ident:#x}"), "training": ident == main, "frames": frames})
    return sorted(stacks, key=lambda stack: not stack["training"])


def _frame(raw: list[Any]) -> dict[str, Any]:
    module, function, path, line = raw
    return {"module": module, "function": function, "file": os.path.basename(path), "line": line}


def training_frames(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The training thread's frames of one rank's answer, innermost first, as the summary names them."""
    threads = answer.get("threads") or []
    training = next((t for t in threads if t.get("training")), threads[0] if threads else {"frames": []})
    return [_frame(raw) for raw in training["frames"]]


def summarize(answers: Mapping[int, Mapping[str, Any]], world_size: int) -> tuple[list[dict[str, Any]], list[int]]:
    """The summary's groups (ranks whose training threads stand in the same frames, by their first rank) and
    the silent ranks. Past MAX_GROUPS distinct stacks, the ranks of the rest form one last group without frames."""
    by_stack: dict[str, list[int]] = {}
    frames_of: dict[str, list[dict[str, Any]]] = {}
    threads_of: dict[str, int] = {}
    for rank in sorted(answers):
        frames = training_frames(answers[rank])
        key = json.dumps(frames)
        by_stack.setdefault(key, []).append(rank)
        frames_of.setdefault(key, frames)
        threads_of.setdefault(key, len(answers[rank].get("threads") or []))
    groups = []
    for key, ranks in by_stack.items():
        if len(groups) == MAX_GROUPS - 1 and len(by_stack) > MAX_GROUPS:
            rest = [rank for later in list(by_stack.values())[len(groups):] for rank in later]
            groups.append({"ranks": format_ranks(rest), "frames": [], "code": []})
            break
        frames = frames_of[key]
        code = [frame for frame in frames if not is_framework(frame["module"])][:MAX_CODE_FRAMES]
        groups.append({"ranks": format_ranks(ranks), "threads": threads_of[key], "frames": frames[:MAX_FRAMES], "code": code})
    silent = [rank for rank in range(world_size) if rank not in answers]
    return groups, silent


def bounded(groups: list[dict[str, Any]], limit: int = contract.MAX_HANG_RECORD_BYTES // 2) -> list[dict[str, Any]]:
    """The groups with fewer innermost frames each, until they fit in `limit` bytes of JSON."""
    keep = MAX_FRAMES
    while keep > 1 and len(json.dumps(groups)) > limit:
        keep //= 2
        groups = [{**group, "frames": group["frames"][:keep]} for group in groups]
    return groups


def stacks_text(answer: Mapping[str, Any]) -> str:
    """One rank's full stacks, as stacks.txt holds them (most recent call first, as faulthandler writes)."""
    where = f"pod {answer.get('pod')}" + (f" on node {answer['node']}" if answer.get("node") else "")
    threads = answer.get("threads") or []
    lines = [f"rank {answer.get('rank')} ({where}): {len(threads)} Python thread(s) at {answer.get('time')}"]
    for thread in threads:
        role = " (the training thread)" if thread.get("training") else ""
        lines.append(f"\nThread {thread.get('name')}{role}, most recent call first:")
        lines.extend(f'  File "{path}", line {line}, in {function}' for _, function, path, line in thread["frames"])
    return "\n".join(lines) + "\n"


def _write(directory: str, name: str, data: bytes) -> None:
    """A file into a hang's directory: a path under artifacts.dir, or an object-storage URL."""
    if is_object_url(directory):
        upload = object_store.put_bytes(object_store.join(directory, name), data)
        if not upload.ok:
            raise OSError(f"cannot upload {name} to {directory}: {upload.error}")
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / name).write_bytes(data)


def write_dumps(directory: str, answers: Mapping[int, Mapping[str, Any]], silent: list[int], summary: Mapping[str, Any]) -> None:
    """Every rank's full stacks (stacks.txt) and the summary rank 0 sent (hang.json)."""
    texts = [stacks_text(answers[rank]) for rank in sorted(answers)]
    texts += [f"rank {rank}: no answer within {ANSWER_SECONDS:g} s (stopped, cut off from rank 0, or holding the "
              "interpreter lock in native code)\n" for rank in silent]
    _write(directory, contract.STACKS_FILE_NAME, ("\n" + "=" * 78 + "\n").join(texts).encode())
    _write(directory, contract.HANG_SUMMARY_FILE_NAME, (json.dumps(summary, indent=2) + "\n").encode())


def flight_recorder_on(env: Mapping[str, str]) -> bool:
    names = (contract.ENV_FLIGHT_RECORDER_BUFFER, contract.ENV_FLIGHT_RECORDER_BUFFER_OLD_NAME)
    return any((env.get(name) or "0").strip().isdigit() and int(env.get(name) or "0") > 0 for name in names)


def dump_flight_recorder(directory: str, rank: int) -> None:
    """This rank's flight recorder (its last collectives, pickled as PyTorch's own dumps are, named <prefix><rank> as
    `torchfrtrace --prefix` reads them) into the hang's directory: NCCL's on GPUs, gloo's recorder otherwise."""
    import torch
    import torch.distributed as dist

    backend = dist.get_backend() if dist.is_initialized() else None
    c10d = torch._C._distributed_c10d
    dump = getattr(c10d, "_dump_nccl_trace" if backend == "nccl" else "_dump_fr_trace", None)
    if dump is not None:
        _write(directory, f"{contract.FLIGHT_RECORDER_FILE_PREFIX}{rank}", dump())


class HangWatch:
    """One rank's watch: on rank 0 it decides when to collect and collects; on the others it answers."""

    def __init__(
        self, config: TrainerConfig, env: Mapping[str, str], reporter: ProgressReporter, probe: Probe, after: float
    ) -> None:
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.env = env
        self.artifacts_dir = config.artifacts_dir
        self.connect_timeout = timedelta(seconds=config.nccl.preflight_timeout_seconds or 60)
        self.reporter = reporter
        self.probe = probe
        self.after = after
        self.collections = 0
        self._closed = threading.Event()
        target = self._lead if self.rank == 0 else self._serve
        self._thread = threading.Thread(target=self._guarded, args=(target,), name="dtrain-hang-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching (training is over); rank 0 tells the other ranks' watches to end."""
        self._closed.set()
        if self.rank == 0:
            self._thread.join(ANSWER_SECONDS + 5.0)

    def _guarded(self, target: Callable[[], None]) -> None:
        try:
            target()
        except Exception as exc:  # noqa: BLE001 - the watch must never take training down with it
            log.warning("the hang watch stopped (%s: %s); a hang is still caught, without stacks", type(exc).__name__, exc)

    def _connect(self) -> Any:
        """A store client of the watch's own, to torchrun's store (the training group's is never shared)."""
        import torch.distributed as dist

        store, _, _ = next(dist.rendezvous("env://", self.rank, self.world_size, timeout=self.connect_timeout))
        return dist.PrefixStore(STORE_PREFIX, store)

    def _answer(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pod": self.env.get(contract.ENV_POD_NAME) or self.env.get("HOSTNAME"),
            "node": self.env.get(contract.ENV_NODE_NAME),
            "time": utc_now(),
            "threads": thread_stacks(skip=threading.get_ident()),
        }

    def _flight_recorder(self, directory: str) -> None:
        if flight_recorder_on(self.env):
            try:
                dump_flight_recorder(directory, self.rank)
            except Exception as exc:  # noqa: BLE001 - the stacks are answered already; say why this part is missing
                log.warning("no flight recorder dump for this hang (%s: %s)", type(exc).__name__, exc)

    def _serve(self) -> None:
        """Another rank's watch: answer each of rank 0's requests, until it says the end."""
        import torch.distributed as dist

        store = self._connect()
        request = 0
        while True:
            request += 1
            key = f"request/{request}"
            while True:
                try:
                    store.wait([key], SERVE_WAIT)
                    break
                except dist.DistNetworkError:
                    return  # rank 0's node is gone: so is the gang
                except dist.DistStoreError:
                    continue  # a day without a hang: wait again
            asked = json.loads(store.get(key))
            if asked.get(END):
                return
            store.set(f"answer/{request}/{self.rank}", json.dumps(self._answer()))
            store.add(f"answered/{request}", 1)
            self._flight_recorder(asked["dir"])

    def _lead(self) -> None:
        """Rank 0's watch: collect once per stall, when it has lasted `after` seconds."""
        store = self._connect() if self.world_size > 1 else None
        moved_at, last, collected = time.monotonic(), None, None
        while not self._closed.wait(POLL_SECONDS):
            batches, holding, step = self.probe()
            now = time.monotonic()
            if batches != last or holding:
                moved_at, last = now, batches
            elif batches and collected != batches and now - moved_at >= self.after:
                collected = batches
                self._collect(store, step, batches, now - moved_at)
        if store is not None:
            store.set(f"request/{self.collections + 1}", json.dumps({END: True}))

    def _gather(self, store: Any, request: int) -> dict[int, dict[str, Any]]:
        """The other ranks' answers to `request` that come within ANSWER_SECONDS."""
        deadline = time.monotonic() + ANSWER_SECONDS
        while store.add(f"answered/{request}", 0) < self.world_size - 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        answers = {}
        for rank in range(1, self.world_size):
            key = f"answer/{request}/{rank}"
            if store.check([key]):
                answers[rank] = json.loads(store.get(key))
        return answers

    def _collect(self, store: Any, step: int | None, batches: int, stalled: float) -> None:
        self.collections += 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        name = f"{contract.HANGS_DIR_NAME}/{stamp}-step-{step}"
        directory = object_store.join(self.artifacts_dir, name) if is_object_url(self.artifacts_dir) else str(Path(self.artifacts_dir) / name)
        if store is not None:
            store.set(f"request/{self.collections}", json.dumps({"dir": directory}))
        answers = {0: self._answer()}
        if store is not None:
            answers.update(self._gather(store, self.collections))
        groups, silent = summarize(answers, self.world_size)
        summary = {
            "step": step,
            "batches": batches,
            "stalledSeconds": round(stalled, 1),
            "worldSize": self.world_size,
            "groups": bounded(groups),
            "silent": format_ranks(silent) or None,
            "dumps": directory,
        }
        # The record first: the operator needs it before its deadline; the files can follow.
        self.reporter.event(Event.HANG, **summary)
        log.warning("no batch completed for %.0f s: every rank's stacks are in %s", stalled, directory)
        try:
            write_dumps(directory, answers, silent, {**summary, "groups": groups})
        except OSError as exc:
            log.warning("cannot write the hang's stacks to %s (%s)", directory, exc)
        self._flight_recorder(directory)


class _NoWatch:
    def close(self) -> None:
        pass


def start(
    config: TrainerConfig, env: Mapping[str, str], reporter: ProgressReporter, probe: Probe, report_interval: float
) -> HangWatch | _NoWatch:
    """This rank's hang watch, or none where the progress deadline is off."""
    timeout_dump = env.get(contract.ENV_FLIGHT_RECORDER_DUMP_FILE)
    if timeout_dump and flight_recorder_on(env):
        # NCCL writes its own dump at a collective timeout into this directory, and does not create it.
        Path(timeout_dump).parent.mkdir(parents=True, exist_ok=True)
    after = collect_after_seconds(config.progress_deadline_seconds, report_interval)
    if after is None:
        return _NoWatch()
    return HangWatch(config, env, reporter, probe, after)
