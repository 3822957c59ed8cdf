"""The engine Job's command on object storage: it reads model.onnx, artifacts.json and the checkpoint from the
bucket and writes the engine, its report and the timing cache back, against the real S3 server (tests/s3server.py).
The build runs on the TensorRT double, so that a model.plan is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtrain_operator.api import contract
from tests.s3server import S3Server


@pytest.fixture
def bucket_artifacts(trained_artifacts: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch):
    """The trained artifacts in the bucket, as the trainer uploads them (artifacts.json naming the checkpoint's URL),
    and this process's environment pointing at the server, as the operator's does in an engine pod."""
    import s3fs

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
    prefix = s3_server.url("engine/default/tiny")
    directory = trained_artifacts.parent
    fs.put_file(str(directory / "checkpoints" / "last.ckpt"), f"{prefix}/checkpoints/step=00000003.ckpt")
    record = json.loads((directory / contract.ARTIFACTS_FILE_NAME).read_text())
    record[contract.ARTIFACTS_KEY_CHECKPOINT] = {"path": f"{prefix}/checkpoints/step=00000003.ckpt"}
    fs.pipe_file(f"{prefix}/artifacts/{contract.ARTIFACTS_FILE_NAME}", json.dumps(record).encode())
    fs.put_file(str(trained_artifacts), f"{prefix}/artifacts/{contract.ONNX_FILE_NAME}")
    return fs, f"{prefix}/artifacts"


def test_the_engine_reads_and_writes_the_bucket(build_with_double, bucket_artifacts, termination_log: Path) -> None:
    fs, artifacts = bucket_artifacts
    plan, report_url = f"{artifacts}/{contract.ENGINE_FILE_NAME}", f"{artifacts}/{contract.ENGINE_REPORT_FILE_NAME}"
    result = build_with_double(
        f"{artifacts}/{contract.ONNX_FILE_NAME}", "--precision", "fp32", "--max-batch", "4",
        "--timing-cache", f"{artifacts}/{contract.TIMING_CACHE_FILE_NAME}", "--report", report_url, out=plan,  # type: ignore[arg-type]
    )
    assert result.exit_code == 0, result.stderr
    names = {path.rsplit("/", 1)[-1] for path in fs.ls(artifacts.removeprefix("s3://"))}
    assert {contract.ENGINE_FILE_NAME, contract.ENGINE_REPORT_FILE_NAME, contract.TIMING_CACHE_FILE_NAME} <= names
    report = json.loads(fs.cat_file(report_url))
    assert report["passed"] is True
    # The report names the bucket's objects, not the scratch copies the build ran on.
    assert report["engine"] == plan
    record = f"{artifacts}/{contract.ARTIFACTS_FILE_NAME}"  # naming the checkpoint's URL, downloaded for the baseline
    assert report["pytorch"]["origin"] == f"checkpoint from {record}, model from {record}"
    assert "dtrain-engine-" not in json.dumps(report)
    assert plan in termination_log.read_text()


def test_an_engine_job_without_its_model_in_the_bucket_says_so(build_engine, s3_server: S3Server, monkeypatch) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    missing = s3_server.url("engine/nothing-here")
    result = build_engine(f"{missing}/model.onnx", out=f"{missing}/model.plan")  # type: ignore[arg-type]
    assert result.exit_code == 2
    assert f"--onnx {missing}/model.onnx: no such object" in result.stderr
