"""Checking and timing a model under test against references, whatever runs it.

A backend (TensorRT, ONNX Runtime, PyTorch eager) is anything with `infer` (host arrays
in, named host arrays out, for one optimisation profile where the backend has them) and
`measure` (the latency of one batch from inputs already where the backend wants them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from dtrain_common.accuracy import max_relative_error
from dtrain_engine.onnx_model import EngineError, OnnxModelInfo

Arrays = Mapping[str, np.ndarray]


class Backend(Protocol):
    name: str

    def infer(self, inputs: Arrays, profile: int = 0) -> dict[str, np.ndarray]: ...

    def measure(self, inputs: Arrays, profile: int, batch_size: int, settings: TimingSettings) -> Timing: ...

    def prepare_timed_run(self, inputs: Arrays) -> Callable[[], None]: ...


def random_batch(model: OnnxModelInfo, shapes: Mapping[str, tuple[int, ...]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A fresh batch of standard-normal inputs (the scale of normalised images) of the given shapes."""
    return {
        tensor.name: rng.standard_normal(tuple(shapes[tensor.name]), dtype=np.float32).astype(tensor.dtype)
        for tensor in model.inputs
    }


# --- Accuracy ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """The model under test against one reference at one set of input shapes."""

    reference: str
    batch_size: int
    max_relative_error: float | None  # over the float outputs; None when the outputs cannot be compared
    bound: float
    problem: str | None = None
    profile: int = 0
    point: str = ""
    exact_outputs: tuple[str, ...] = ()  # integer/boolean outputs, compared for equality

    @property
    def passed(self) -> bool:
        return self.problem is None and self.max_relative_error is not None and self.max_relative_error <= self.bound

    def to_json(self) -> dict[str, object]:
        error = self.max_relative_error
        return {
            "reference": self.reference,
            "profile": self.profile,
            "point": self.point,
            "batch_size": self.batch_size,
            "max_relative_error": None if error is None or not np.isfinite(error) else error,
            "bound": self.bound,
            "compared_exactly": list(self.exact_outputs),
            "passed": self.passed,
            **({"problem": self.problem} if self.problem else {}),
        }


def is_exact(array: np.ndarray) -> bool:
    """Indices and masks: a relative error means nothing for them, so they must be equal."""
    return np.asarray(array).dtype.kind in "iub"


def compare_outputs(
    outputs: Arrays, references: Arrays, reference_name: str, batch_size: int, bound: float,
    profile: int = 0, point: str = "",
) -> Comparison:
    """Every output of the reference against the same-named output under test: float outputs by the
    worst relative error, integer and boolean outputs element for element."""
    worst = 0.0
    exact: list[str] = []

    def result(error: float | None, problem: str | None) -> Comparison:
        return Comparison(reference_name, batch_size, error, bound, problem, profile, point, tuple(exact))

    for name, reference in references.items():
        if name not in outputs:
            return result(None, f"output '{name}' is missing")
        output = np.asarray(outputs[name])
        if tuple(output.shape) != tuple(reference.shape):
            return result(None, f"output '{name}' has shape {list(output.shape)}, the reference {list(reference.shape)}")
        if is_exact(reference):
            exact.append(name)
            differing = int(np.count_nonzero(output != np.asarray(reference)))
            if differing:
                return result(worst, f"output '{name}' ({reference.dtype}) differs in {differing} of {reference.size} "
                                     "elements; integer and boolean outputs must be equal")
            continue
        worst = max(worst, max_relative_error(output, reference))
    problem = "non-finite values (inf/nan) in the outputs" if not np.isfinite(worst) else None
    return result(worst, problem)


def non_finite_outputs(outputs: Arrays) -> list[str]:
    """Names of the outputs holding inf or nan: checked on every run, with or without a reference."""
    return [
        name for name, value in outputs.items()
        if not is_exact(value) and not np.all(np.isfinite(np.asarray(value, dtype=np.float64)))
    ]


# --- Timing -----------------------------------------------------------------------------

MIN_TIMED_RUNS = 5
# What each latency was measured with, as the report says it.
GPU_CLOCK = "cuda events on the engine's stream (GPU compute time, as trtexec reports it)"
HOST_CLOCK = "host wall clock per call (launch and synchronize)"
GRAPH_CLOCK = "cuda events on the engine's stream, one CUDA graph replay per run"


@dataclass(frozen=True)
class TimingSettings:
    warmup: int = 10
    iterations: int = 100
    max_seconds: float = 10.0  # per backend and batch size; at least MIN_TIMED_RUNS runs are timed


@dataclass(frozen=True)
class LatencyStats:
    batch_size: int
    warmup: int
    iterations: int
    median_ms: float
    p99_ms: float
    mean_ms: float
    clock: str = "host wall clock"

    @property
    def images_per_second(self) -> float:
        return self.batch_size / (self.median_ms / 1000.0) if self.median_ms > 0 else float("inf")

    def to_json(self) -> dict[str, object]:
        return {
            "batch_size": self.batch_size,
            "median_ms": round(self.median_ms, 6),
            "p99_ms": round(self.p99_ms, 6),
            "mean_ms": round(self.mean_ms, 6),
            "images_per_second": round(self.images_per_second, 2),
            "iterations": self.iterations,
            "warmup": self.warmup,
            "clock": self.clock,
        }


@dataclass(frozen=True)
class Timing:
    """One backend at one set of input shapes: the number the report leads with, and any others
    measured alongside (TensorRT: host wall clock per call, and CUDA-graph replays)."""

    primary: LatencyStats
    others: tuple[LatencyStats, ...] = ()


def summarize_latencies(
    samples_seconds: Sequence[float], batch_size: int, warmup: int, clock: str = "host wall clock"
) -> LatencyStats:
    """Median and 99th percentile of per-batch latencies; throughput is batch size / median."""
    if not samples_seconds:
        raise ValueError("no timed runs")
    ms = np.asarray(samples_seconds, dtype=np.float64) * 1000.0
    return LatencyStats(
        batch_size=batch_size,
        warmup=warmup,
        iterations=len(ms),
        median_ms=float(np.median(ms)),
        p99_ms=float(np.percentile(ms, 99)),
        mean_ms=float(np.mean(ms)),
        clock=clock,
    )


def measure_samples(
    sample: Callable[[], float],
    batch_size: int,
    settings: TimingSettings,
    clock: Callable[[], float] = time.perf_counter,
    label: str = "host wall clock",
) -> LatencyStats:
    """Warm up, then take samples (each one run, returning the seconds it took by whatever timer it
    uses) until `iterations` or the time budget (kept by `clock`) is spent.

    Warm-up stops early after a quarter of the budget, so that a slow CPU fallback of a large
    model still finishes; the report records how many runs each number rests on.
    """
    return _measure_in_turn([sample], batch_size, settings, clock, label)[0]


def _measure_in_turn(
    samplers: Sequence[Callable[[], float]],
    batch_size: int,
    settings: TimingSettings,
    clock: Callable[[], float],
    label: str,
) -> list[LatencyStats]:
    """measure_samples for several samplers, one sample of each per round; the budget grows with their number, so
    that each gets what it would get alone."""
    start = clock()
    warmed = 0
    while warmed < settings.warmup and (warmed == 0 or clock() - start < settings.max_seconds * len(samplers) / 4):
        for sample in samplers:
            sample()
        warmed += 1
    taken: list[list[float]] = [[] for _ in samplers]
    timed_start = clock()
    while len(taken[0]) < settings.iterations:
        for sample, samples in zip(samplers, taken):
            samples.append(sample())
        if len(taken[0]) >= MIN_TIMED_RUNS and clock() - timed_start > settings.max_seconds * len(samplers):
            break
    return [summarize_latencies(samples, batch_size, warmed, label) for samples in taken]


def wall_clock_sample(run: Callable[[], None], clock: Callable[[], float]) -> Callable[[], float]:
    """A sampler of `run`'s host wall-clock time (it returns when its results are ready)."""

    def sample() -> float:
        before = clock()
        run()
        return clock() - before

    return sample


def measure_latency(
    run: Callable[[], None],
    batch_size: int,
    settings: TimingSettings,
    clock: Callable[[], float] = time.perf_counter,
) -> LatencyStats:
    """Host wall-clock time of `run` (which returns when its results are ready)."""
    return measure_samples(wall_clock_sample(run, clock), batch_size, settings, clock)


def measure_alternately(
    runs: Sequence[Callable[[], None]],
    batch_size: int,
    settings: TimingSettings,
    clock: Callable[[], float] = time.perf_counter,
) -> list[LatencyStats]:
    """Host wall-clock time of each of `runs`, warmed up and then timed in turn (one run of each per round), so
    that whatever else the machine does weighs on all of them alike. Each gets the warm-up, the runs and the
    time budget `measure_latency` would give it alone."""
    return _measure_in_turn([wall_clock_sample(run, clock) for run in runs], batch_size, settings, clock,
                            "host wall clock")


# --- ONNX Runtime on the CPU -------------------------------------------------------------


class OnnxRuntimeCpu:
    """ONNX Runtime's CPU provider: the reference for TensorRT, and the fallback's model under test."""

    name = "onnxruntime-cpu"

    def __init__(self, onnx_path: str, threads: int | None = None):
        """`threads`: the intra-op threads (ONNX Runtime's default: one per core), set to PyTorch's where the two
        are timed side by side, so that neither computes on more cores than the other."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads is not None:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
        except Exception as error:  # noqa: BLE001 - ORT raises its own exception types for models it cannot load
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise EngineError(f"ONNX Runtime cannot load {onnx_path}: {first_line}") from None
        self._output_names = [output.name for output in self._session.get_outputs()]

    def infer(self, inputs: Arrays, profile: int = 0) -> dict[str, np.ndarray]:
        results = self._session.run(self._output_names, dict(inputs))
        return {name: np.asarray(value) for name, value in zip(self._output_names, results)}

    def prepare_timed_run(self, inputs: Arrays) -> Callable[[], None]:
        feed = dict(inputs)
        session, names = self._session, self._output_names

        def run() -> None:
            session.run(names, feed)

        return run

    def measure(self, inputs: Arrays, profile: int, batch_size: int, settings: TimingSettings) -> Timing:
        return Timing(measure_latency(self.prepare_timed_run(inputs), batch_size, settings))
