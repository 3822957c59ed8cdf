"""An S3 server users run: the Versity S3 Gateway (versitygw) on a POSIX directory, built unmodified from its
pinned Go module by tools/s3server/build.sh. `make cluster` serves it to the pods on the bridge; the tests and
bench/checkpoint_cost.py start their own on 127.0.0.1 (tests/s3server.py). Both go through these functions.

It imports nothing of the cluster's layout, so a process may use it without fixing the cluster's state
directory and ports (bench/control_plane.py chooses those before localcluster.layout is first imported).
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "tools" / "s3server" / "build.sh"
BINARY = REPO / ".tools" / "bin" / "versitygw"
REGION = "us-east-1"
# A cold build compiles the gateway and the AWS and Azure SDKs it links: a minute or two on two cores.
BUILD_TIMEOUT_SECONDS = 1800


class ObjectStoreError(RuntimeError):
    pass


def build() -> Path:
    """The gateway's binary, built once (a rebuild is skipped while go.mod and go.sum are older than it)."""
    subprocess.run(["bash", str(BUILD_SCRIPT), str(BINARY)], check=True, timeout=BUILD_TIMEOUT_SECONDS)
    return BINARY


def gateway_argv(listen: str, data_dir: Path) -> list[str]:
    """The gateway serving S3 on `listen` (host:port) from the folders under `data_dir` (one per bucket).
    The keys are not here: they go in its environment (gateway_env), where `ps` does not show them."""
    return [str(BINARY), "--port", listen, "--region", REGION, "--quiet", "posix", str(data_dir)]


def gateway_env(access_key: str, secret_key: str) -> dict[str, str]:
    return {"ROOT_ACCESS_KEY_ID": access_key, "ROOT_SECRET_ACCESS_KEY": secret_key, "PATH": "/usr/bin:/bin"}


def client_env(endpoint: str, access_key: str, secret_key: str) -> dict[str, str]:
    """What a client process needs (the SDK's variables), as the operator sets them in a pod from the Secret."""
    return {
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
    }


def answers(endpoint: str) -> bool:
    """Whether an S3 server answers on `endpoint` (an unsigned request is refused with an S3 error: that is an answer)."""
    try:
        urllib.request.urlopen(endpoint, timeout=2)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def wait_until_answering(endpoint: str, alive: Callable[[], bool], timeout: float, log_tail: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise ObjectStoreError(f"versitygw exited before serving {endpoint}: {log_tail()}")
        if answers(endpoint):
            return
        time.sleep(0.2)
    raise ObjectStoreError(f"versitygw did not serve S3 on {endpoint} within {timeout:.0f} s: {log_tail()}")


def create_bucket(endpoint: str, access_key: str, secret_key: str, bucket: str) -> None:
    """The bucket, made through the S3 API as a user makes one (an existing one of ours is kept)."""
    import botocore.session
    from botocore.exceptions import ClientError

    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
    )
    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
            raise
