"""Checkpoint cost: what one save costs on a local disk and on S3, per 100 MB, through the trainer's own writers.

The checkpoint is a dict of float32 tensors of the given size (what torch.save writes of a model and its
optimizer state). Each is written `--repeats` times with the trainer's writers:

- **local**: AtomicCheckpointIO (a temporary file, fsync, rename), into a temporary directory on this disk;
- **s3**: checkpoint_store.upload_checkpoint (torch.save streamed into a multipart upload, 16 MiB parts),
  to the real S3 server the tests use (versitygw on 127.0.0.1, tests/s3server.py; built by
  tools/s3server/build.sh). A loopback server: a cloud bucket adds the network's time.

Reported: the median seconds of a save, the same per 100 MB (the figure "checkpoint upload time per 100 MB"),
and the peak memory a save adds above the checkpoint itself (sampled RSS): the streamed upload adds about the
largest tensor (torch.save's own copy of it) and a few parts in flight, not a second copy of the checkpoint.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.checkpoint_cost [--sizes-mb 100 400] [--repeats 3]
    ... --smoke     (256 MB, once each: for the tests; the figures are not meant to be read)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import torch

from bench.common import machine, markdown_table, write_results

if TYPE_CHECKING:
    from typing_extensions import Self

MB = 1_000_000
PER = 100 * MB


def make_checkpoint(size_bytes: int) -> dict[str, Any]:
    """A checkpoint of `size_bytes` of float32 tensors, in 8 tensors as a model's layers would be."""
    per_tensor = size_bytes // 4 // 8
    return {"state_dict": {f"layer{i}.weight": torch.randn(per_tensor) for i in range(8)}, "global_step": 1}


class PeakRss:
    """The highest resident memory of this process while the block runs, sampled every 5 ms."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def __enter__(self) -> Self:
        self.peak = self.process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def timed(save: Callable[[], None]) -> tuple[float, int]:
    """Seconds of one save and the memory it added above what the process held before it."""
    before = psutil.Process().memory_info().rss
    with PeakRss() as rss:
        started = time.perf_counter()
        save()
        seconds = time.perf_counter() - started
    return seconds, max(0, rss.peak - before)


def measure(name: str, size: int, repeats: int, save: Callable[[int], None]) -> dict[str, Any]:
    runs = [timed(lambda i=i: save(i)) for i in range(repeats)]
    seconds = statistics.median(s for s, _ in runs)
    return {
        "target": name,
        "size_mb": round(size / MB),
        "repeats": repeats,
        "median_seconds": round(seconds, 3),
        "seconds_per_100mb": round(seconds * PER / size, 3),
        "mb_per_second": round(size / MB / seconds, 1),
        "peak_added_mb": round(max(extra for _, extra in runs) / MB, 1),
    }


def run(sizes_mb: list[int], repeats: int) -> list[dict[str, Any]]:
    from dtrain_trainer.checkpoint_store import upload_checkpoint
    from dtrain_trainer.checkpointing import AtomicCheckpointIO
    from tests.s3server import S3Server

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-ckpt-") as scratch:
        server = S3Server.start_new(Path(scratch) / "s3server")
        try:
            os.environ.update(server.env())
            local = AtomicCheckpointIO()
            for size_mb in sizes_mb:
                size = size_mb * MB
                checkpoint = make_checkpoint(size)

                def to_disk(i: int, size_mb: int = size_mb, checkpoint: dict[str, Any] = checkpoint) -> None:
                    local.save_checkpoint(checkpoint, Path(scratch) / "local" / f"{size_mb}-{i}.ckpt")

                def to_s3(i: int, size_mb: int = size_mb, checkpoint: dict[str, Any] = checkpoint) -> None:
                    upload = upload_checkpoint(checkpoint, server.url(f"bench/{size_mb}-{i}.ckpt"))
                    if not upload.ok:
                        raise RuntimeError(f"the upload failed: {upload.error}")

                rows.append(measure("local disk", size, repeats, to_disk))
                rows.append(measure("s3 (versitygw on 127.0.0.1)", size, repeats, to_s3))
                del checkpoint
        finally:
            server.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=None, help="checkpoint sizes (default 100 400 1000)")
    parser.add_argument("--repeats", type=int, default=None, help="saves per size and target (default 3)")
    parser.add_argument("--smoke", action="store_true", help="256 MB once each, for the tests")
    parser.add_argument("--out", help="results JSON (default bench/results/checkpoint_cost.json)")
    args = parser.parse_args(argv)
    sizes = args.sizes_mb or ([256] if args.smoke else [100, 400, 1000])
    repeats = args.repeats or (1 if args.smoke else 3)
    started = machine()
    rows = run(sizes, repeats)
    upload = [r["seconds_per_100mb"] for r in rows if r["target"].startswith("s3")]
    figure = round(statistics.median(upload), 3)
    headers = ["target", "size MB", "median s", "s per 100 MB", "MB/s", "peak added MB"]
    print(markdown_table(headers, [[r["target"], r["size_mb"], r["median_seconds"], r["seconds_per_100mb"],
                                    r["mb_per_second"], r["peak_added_mb"]] for r in rows]))
    print(f"\ncheckpoint upload time per 100 MB: {figure} s (median over sizes {sizes}, {repeats} save(s) each)")
    path = write_results("checkpoint_cost", {"machine": started, "rows": rows, "upload_seconds_per_100mb": figure}, args.out)
    print(f"results: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
