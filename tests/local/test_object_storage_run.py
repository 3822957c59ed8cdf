"""`dtrain run` with spec.storage.url: the local nodes and the engine step keep checkpoints and artifacts in the bucket
of the real S3 server (tests/s3server.py), as the pods would; the credentials come from the caller's environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.s3server import S3Server

from .dtrain_process import DtrainRun, tiny_job, write_job

pytestmark = pytest.mark.slow


def test_dtrain_run_keeps_checkpoints_and_artifacts_in_the_bucket(
    tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    env = s3_server.env()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, env[name])  # as a person exports them; the endpoint comes from the spec
    storage = {"url": s3_server.url("local-runs"), "s3": {"endpoint": s3_server.endpoint, "region": env["AWS_REGION"]}}
    job = write_job(tmp_path, tiny_job("tiny-s3", storage=storage))
    run = DtrainRun(tmp_path, str(job))
    assert run.wait(240) == 0, run.output

    fs = s3fs.S3FileSystem(key=env["AWS_ACCESS_KEY_ID"], secret=env["AWS_SECRET_ACCESS_KEY"],
                           client_kwargs={"endpoint_url": s3_server.endpoint}, skip_instance_cache=True,
                           use_listings_cache=False)
    prefix = "dtrain-test/local-runs/default/tiny-s3"  # per job: <url>/<namespace>/<name>
    checkpoints = {p.rsplit("/", 1)[-1] for p in fs.ls(f"{prefix}/checkpoints")}
    assert "last.json" in checkpoints and "step=00000004.ckpt" in checkpoints
    artifacts = {p.rsplit("/", 1)[-1] for p in fs.ls(f"{prefix}/artifacts")}
    assert {"model.onnx", "artifacts.json", "engine-report.json"} <= artifacts
    summary = json.loads((tmp_path / "dtrain-runs" / "tiny-s3" / "summary.json").read_text())
    assert summary["checkpoint"] == f"s3://{prefix}/checkpoints/step=00000004.ckpt"
    assert not list((tmp_path / "dtrain-runs" / "tiny-s3" / "checkpoints").iterdir())
