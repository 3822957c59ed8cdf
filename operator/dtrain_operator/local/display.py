"""What `dtrain run` shows: a live progress bar on a terminal, plain lines elsewhere, and the summary table."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table

from dtrain_operator.api import records
from dtrain_operator.local.summary import RunSummary

# Plain (non-terminal) output prints a progress line at most this often, and at every epoch or checkpoint.
PLAIN_LINE_SECONDS = 10.0
PLAIN_WIDTH = 120
# The rate behind the ETA is measured over about this many recent seconds.
RATE_WINDOW_SECONDS = 60.0


T = TypeVar("T")


def _newer(value: T | None, previous: T | None) -> T | None:
    """A record's value, or the one shown before when the record does not know it."""
    return previous if value is None else value


def format_duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "--:--"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def event_line(record: records.AnyTrainerRecord) -> str:
    """One line for a trainer event that is not progress (start, resumed, export, preflight)."""
    if isinstance(record, records.StartRecord):
        return (
            f"training started: world size {record.world_size}, precision {record.precision}"
            + (f", resuming from {record.resume_from}" if record.resume_from else "")
        )
    if isinstance(record, records.ResumedRecord):
        by = f" (saved by surviving rank {record.survivor.rank} after a peer was lost)" if record.survivor else ""
        return f"resumed from {record.path} at step {record.step}{by}"
    if isinstance(record, records.ExportRecord):
        if record.ok:
            parity = "-" if record.parity_error is None else f"{record.parity_error:.2e}"
            return f"exported {record.onnx} (ONNX Runtime parity: max relative error {parity})"
        return f"ONNX export failed: {record.error}"
    if isinstance(record, records.PreflightRecord):
        return (
            f"pre-flight: {record.world_size} ranks joined; {record.backend} all-reduce latency "
            f"{_value(record.latency_ms, '{:.3g}')} ms, bus bandwidth "
            f"{_value(record.bus_bandwidth_g_bps, '{:.3g}')} GB/s ({_value(record.seconds, '{:.2f}')} s)"
        )
    return str(record.to_wire())


@dataclass
class ProgressView:
    """The progress line's values, updated from the trainer's progress records (pure: the clock is passed in)."""

    started: float
    epoch: int | None = None
    max_epochs: int | None = None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    images_per_second: float | None = None
    checkpoint_step: int | None = None
    # The trainer's reported metrics (val_loss, val_acc, prog_bar ones), newest values.
    metrics: dict[str, float] = field(default_factory=dict)
    restarts: int = 0
    _rate_points: tuple[tuple[float, int], ...] = ()

    def apply(self, record: Mapping[str, Any], now: float, restarts: int) -> str:
        """Take one trainer record in, as written (read with dtrain_operator.api.records); return what it was.

        "epoch" for a progress record that ends an epoch, "end" for the end of training,
        otherwise the record's event ("progress", "checkpoint", "warning", ...); "" for a record
        that is none.
        """
        return self.take(records.read_record(record), now, restarts)

    def take(self, record: records.AnyTrainerRecord | None, now: float, restarts: int) -> str:
        """`apply` for a record already read."""
        restarted = restarts != self.restarts
        self.restarts = restarts
        if isinstance(record, records.StartRecord):
            self.max_epochs = record.max_epochs
        elif isinstance(record, records.ResumedRecord):
            self.step, self.epoch = record.step, record.epoch
            self._rate_points = ()
        elif isinstance(record, (records.ProgressRecord, records.FinishedRecord)):
            if isinstance(record, records.ProgressRecord):
                # Lightning's epoch counter has already moved past the last epoch when training finishes.
                self.epoch = _newer(record.epoch, self.epoch)
            self.step = _newer(record.step, self.step)
            if isinstance(record, records.ProgressRecord):
                self.total_steps = _newer(record.total_steps, self.total_steps)
            self.loss = _newer(record.loss, self.loss)
            self.images_per_second = _newer(record.images_per_second, self.images_per_second)
            self.metrics.update(record.metrics or {})
            if self.step is not None:
                self._note_step(self.step, now, restarted)
            if isinstance(record, records.FinishedRecord):
                return "end"
            if record.epoch_end:
                return "epoch"
        elif isinstance(record, records.CheckpointRecord) and record.ok is not False:
            self.checkpoint_step = record.step
        return record.EVENT.value if record is not None else ""

    def _note_step(self, step: int, now: float, restarted: bool) -> None:
        points = () if restarted else self._rate_points
        points = tuple(p for p in points if now - p[0] <= RATE_WINDOW_SECONDS and p[1] <= step)
        self._rate_points = (*points, (now, step))

    def eta_seconds(self) -> float | None:
        if self.step is None or not self.total_steps or len(self._rate_points) < 2:
            return None
        (t0, s0), (t1, s1) = self._rate_points[0], self._rate_points[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        return max(0, self.total_steps - self.step) / ((s1 - s0) / (t1 - t0))

    def fields(self, now: float) -> dict[str, str]:
        epoch = "-" if self.epoch is None else str(self.epoch + 1)
        if self.max_epochs:
            epoch += f"/{self.max_epochs}"
        step = "-" if self.step is None else str(self.step)
        if self.total_steps:
            step += f"/{self.total_steps}"
        return {
            "epoch": epoch,
            "step": step,
            "loss": "-" if self.loss is None else f"{self.loss:.4g}",
            "ips": "-" if self.images_per_second is None else f"{self.images_per_second:,.0f}",
            "elapsed": format_duration(now - self.started),
            "eta": format_duration(self.eta_seconds()),
            "metrics": "".join(f"  {name} {value:.4g}" for name, value in self.metrics.items()),
        }

    def line(self, now: float) -> str:
        f = self.fields(now)
        text = (
            f"epoch {f['epoch']}  step {f['step']}  loss {f['loss']}{f['metrics']}  {f['ips']} img/s  "
            f"elapsed {f['elapsed']}  ETA {f['eta']}"
        )
        return text + (f"  restarts {self.restarts}" if self.restarts else "")


class Display:
    """Console output of one run. Rich renders the bar and tables; without a terminal, plain lines."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self.view = ProgressView(started=time.monotonic())
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._last_line = 0.0

    @classmethod
    def for_stream(cls, stream: TextIO) -> Display:
        console = Console(file=stream, highlight=False, soft_wrap=True)
        if not console.is_terminal:
            # Logs and CI: wide enough that the summary's paths stay on one line.
            console = Console(file=stream, highlight=False, soft_wrap=True, width=PLAIN_WIDTH)
        return cls(console)

    # --- messages -------------------------------------------------------------------------

    def info(self, message: str) -> None:
        self.console.print(escape(message))

    def warn(self, message: str) -> None:
        self.console.print(f"[bold yellow]warning:[/] {escape(message)}")

    def error(self, message: str) -> None:
        self.console.print(f"[bold red]error:[/] {escape(message)}")

    def gang_started(self, generation: int, ranks: list[int], pids: list[int]) -> None:
        nodes = ", ".join(f"node {rank} (pid {pid})" for rank, pid in zip(ranks, pids))
        what = "started" if generation == 0 else f"restarted from the last checkpoint (restart {generation})"
        self.console.print(escape(f"gang {what}: {nodes}"))

    def log_tail(self, who: str, path: Path, tail: str) -> None:
        self.progress_done()
        self.console.print(f"[bold]last lines of {escape(who)}'s log[/] ({escape(str(path))}):")
        self.console.print(tail or "(empty)", markup=False, highlight=False)

    def stopped_hint(self, checkpoint: str | None, job_file: str) -> None:
        if checkpoint:
            self.console.print(escape(f"the last checkpoint is {checkpoint}"))
            self.console.print(escape(f"continue from it with: dtrain run {job_file} --resume"))
        else:
            self.console.print("no checkpoint was written before the run stopped")

    # --- progress ---------------------------------------------------------------------------

    def progress(self, raw: Mapping[str, Any], restarts: int) -> None:
        """Show one trainer record, as written (see dtrain_operator.api.records)."""
        now = time.monotonic()
        record = records.read_record(raw)
        kind = self.view.take(record, now, restarts)
        if isinstance(record, (records.WarningRecord, records.ErrorRecord)):
            style = "bold yellow" if isinstance(record, records.WarningRecord) else "bold red"
            self.console.print(f"[{style}]trainer {kind}:[/] {escape(str(record.message))}")
            return
        if isinstance(record, (records.StartRecord, records.ResumedRecord, records.ExportRecord, records.PreflightRecord)):
            self.console.print(escape(event_line(record)), highlight=False)
            return
        if isinstance(record, records.CheckpointRecord):
            if record.ok is not False:  # a missed one is told by the trainer's warning
                upload = f" ({record.upload_seconds:.1f} s upload)" if record.upload_seconds is not None else ""
                self.console.print(escape(f"checkpoint at step {record.step}: {record.path}{upload}"))
            return
        if self.live:
            self._update_bar(now)
            return
        if kind == "end":
            self.console.print(escape(f"training finished: {self.view.line(now)}"), highlight=False)
            return
        if kind == "epoch" or now - self._last_line >= PLAIN_LINE_SECONDS:
            self._last_line = now
            self.console.print(escape(self.view.line(now)), highlight=False)

    def tick(self) -> None:
        """Keep elapsed time and ETA moving on the bar between the trainer's records."""
        if self._progress is not None:
            self._update_bar(time.monotonic())

    def _update_bar(self, now: float) -> None:
        if self._progress is None:
            self._progress = Progress(
                TextColumn("epoch {task.fields[epoch]}"),
                BarColumn(),
                TextColumn(
                    "step {task.fields[step]}  loss {task.fields[loss]}{task.fields[metrics]}  {task.fields[ips]} img/s"
                ),
                TextColumn("elapsed {task.fields[elapsed]}  ETA {task.fields[eta]}"),
                console=self.console,
                transient=False,
                refresh_per_second=4,
            )
            self._progress.start()
            self._task = None
        fields: dict[str, Any] = self.view.fields(now)
        if self._task is None:
            self._task = self._progress.add_task("training", total=None, **fields)
        self._progress.update(self._task, completed=self.view.step or 0, total=self.view.total_steps, **fields)

    def progress_done(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None

    # --- the summary --------------------------------------------------------------------------

    def summary(self, summary: RunSummary) -> None:
        self.progress_done()
        self.console.print(summary_table(summary))
        if summary.latency:
            self.console.print(latency_table(summary))


def _value(value: object | None, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


def _not_counted(restarts: int) -> str:
    """The restarts that RestartGangIgnoringBackoff rules decided, beside those counted against backoffLimit."""
    return f" (and {restarts} not counted against backoffLimit)" if restarts else ""


def _steps_lost(lost: list[int]) -> str:
    """The steps each restart trained again (RunSummary.steps_lost), one figure per restart."""
    return f"; steps lost {', '.join(map(str, lost))}" if lost else ""


def _goodput(goodput: Mapping[str, Any]) -> str:
    """The productive share, then every category's time, largest first (RunSummary.goodput)."""
    seconds = sorted((goodput.get("seconds") or {}).items(), key=lambda item: -item[1])
    return f"{goodput['ratio']:.0%} productive (" + ", ".join(f"{name} {value:,.0f} s" for name, value in seconds) + ")"


def _gang_rows(table: Table, s: RunSummary) -> None:
    """What the gang's checks found: the pre-flight check, the slowest rank, where the latest hang sat."""
    if s.preflight:
        p = s.preflight
        table.add_row(
            "pre-flight",
            escape(
                f"{p.get('worldSize')} ranks, {p.get('backend')}: all-reduce latency {_value(p.get('latencyMs'), '{:.3g}')} ms, "
                f"bus bandwidth {_value(p.get('busBandwidthGBps'), '{:.3g}')} GB/s ({_value(p.get('seconds'), '{:.2f}')} s)"
            ),
        )
    if s.stragglers and s.stragglers.get("slowestRank") is not None:
        t = s.stragglers
        table.add_row(
            "slowest rank",
            escape(
                f"{t.get('slowestRank')} ({t.get('slowestPod')}): {_value(t.get('ratio'), '{:.2f}')} x the median "
                f"{t.get('measure') or 'step'} time {_value(t.get('medianSeconds'), '{:.3g}')} s" + ("  STRAGGLER" if t.get("straggler") else "")
            ),
        )
    if s.step_breakdown and s.step_breakdown.get("bottleneck"):
        table.add_row("bottleneck", escape(s.step_breakdown["bottleneck"]))
        for row in s.step_breakdown.get("ranks") or []:
            table.add_row("", escape(_rank_breakdown(row)))
    if s.last_hang:
        table.add_row("last hang", escape(s.last_hang))


# The parts of a step (status.progress.stepBreakdown's ranks) as the summary names them.
BREAKDOWN_PARTS = {"dataWait": "data wait", "forward": "forward", "backward": "backward", "allReduce": "all-reduce",
                   "optimizer": "optimizer"}


def _rank_breakdown(row: Mapping[str, Any]) -> str:
    """One rank's seconds per optimizer step by part."""
    parts = ", ".join(f"{name} {_value(row.get(key), '{:.3f}')}" for key, name in BREAKDOWN_PARTS.items())
    return f"rank {row.get('rank')}: {parts} s per step"


def summary_table(s: RunSummary) -> Table:
    style = {"Succeeded": "bold green", "Failed": "bold red"}.get(s.phase, "bold yellow")
    table = Table(title=f"{s.command} {s.job_name}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    phase = s.phase + (f" ({s.reason})" if s.reason else "")
    table.add_row("phase", f"[{style}]{escape(phase)}[/]")
    if s.message and s.phase != "Succeeded":
        table.add_row("why", escape(s.message))
    table.add_row(
        "nodes x processes",
        f"{s.nodes} x {s.devices_per_node} {s.accelerator} (nodes {', '.join(str(r) for r in range(s.nodes))})",
    )
    table.add_row("steps", _value(s.steps))
    table.add_row("final loss", _value(s.final_loss, "{:.4g}"))
    for name, value in s.metrics.items():
        table.add_row(escape(name), f"{value:.4g}")
    table.add_row("throughput", _value(s.images_per_second, "{:,.1f} images/s"))
    table.add_row("restarts", str(s.restarts) + _not_counted(s.restarts_ignoring_backoff) + _steps_lost(s.steps_lost))
    _gang_rows(table, s)
    table.add_row("wall time", format_duration(s.wall_seconds))
    if s.goodput and s.goodput.get("ratio") is not None:
        table.add_row("goodput", escape(_goodput(s.goodput)))
    table.add_row("checkpoint", escape(s.checkpoint or "-"))
    onnx = s.onnx or "-"
    if s.onnx and s.onnx_parity_error is not None:
        onnx += f"  (parity with PyTorch: max relative error {s.onnx_parity_error:.2e})"
    table.add_row("model.onnx", escape(onnx))
    if s.engine_asked:
        if s.engine_path:
            engine = f"{s.engine_backend}: {s.engine_path}"
        elif s.engine_backend:
            engine = f"none built; {s.engine_backend} checked and timed model.onnx instead"
        else:
            engine = "not built"
        table.add_row("engine", escape(engine))
        if s.engine_note:
            table.add_row("", escape(s.engine_note))
        if s.engine_report:
            table.add_row("engine report", escape(s.engine_report))
    else:
        table.add_row("engine", "not asked for")
    if s.workdir:
        table.add_row("workdir", escape(s.workdir))
    return table


def latency_table(s: RunSummary) -> Table:
    threads = f", {s.latency_threads} CPU thread(s) each, timed in turn" if s.latency_threads else ""
    title = f"inference latency ({s.engine_backend or 'engine'} vs PyTorch eager{threads})"
    table = Table(title=title, title_justify="left")
    table.add_column("batch", justify="right")
    table.add_column(f"{s.engine_backend or 'engine'} ms", justify="right")
    table.add_column("eager ms", justify="right")
    table.add_column("speed-up", justify="right")
    for row in s.latency:
        table.add_row(
            str(row.batch),
            _value(row.latency_ms, "{:.3f}"),
            _value(row.eager_ms, "{:.3f}"),
            _value(row.speedup, "{:.2f}x"),
        )
    return table
