"""bench.inference in smoke mode: it runs, prints its table and writes the JSON the README's table comes from."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.bench.smoke import run_smoke, table_header


def test_inference_smoke(tmp_path: Path) -> None:
    run = run_smoke("bench.inference", tmp_path / "inference.json")

    assert table_header(run.stdout)[:3] == ["model", "input", "runtime"]
    results = run.results
    assert results["benchmark"] == "inference"
    assert {"machine", "versions", "threads", "rows"} <= results.keys()
    rows = results["rows"]
    cpu = [r for r in rows if r["runtime"] in ("PyTorch eager", "ONNX Runtime")]
    assert {(r["runtime"], r["batch"]) for r in cpu} == {
        ("PyTorch eager", 1), ("PyTorch eager", 2), ("ONNX Runtime", 1), ("ONNX Runtime", 2)
    }
    for row in cpu:
        assert row["iterations"] >= 3
        assert row["latency_median_ms"] > 0 and row["latency_p99_ms"] >= row["latency_median_ms"]
        assert row["images_per_second"] > 0
        # ONNX Runtime ran the same model as eager: same logits up to float error.
        assert row["max_abs_diff_vs_eager"] < 1e-3
    tensorrt = [r for r in rows if r["runtime"] == "TensorRT fp16"]
    assert tensorrt, "the TensorRT row is always there, measured or saying why not"
    if not torch.cuda.is_available():
        assert all(r["note"].startswith("not available here: ") for r in tensorrt)
        assert all(r["latency_median_ms"] is None for r in tensorrt)
